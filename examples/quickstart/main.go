// Command quickstart shows the outbox end to end with nothing to install:
// orders and their events are written to SQLite in one transaction, a relay
// publishes the events to Watermill's in-process GoChannel through a
// publisher that fails some publishes, and a subscriber counts what arrives.
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -dsn 'mysql://user:pass@127.0.0.1:3306/shop'  # MySQL 8 or MariaDB 10.6+
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/go-sql-driver/mysql"
	_ "modernc.org/sqlite"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

func main() {
	orders := flag.Int("orders", 20, "orders to create")
	failRate := flag.Float64("fail-rate", 0.3, "fraction of publishes the flaky publisher refuses")
	lostAckRate := flag.Float64("lost-ack-rate", 0.1, "fraction of publishes delivered but reported failed (they come back as duplicates)")
	verbose := flag.Bool("v", false, "log every retry")
	dsn := flag.String("dsn", "", "a MySQL or MariaDB database (mysql://user:pass@host:3306/db) instead of a temporary SQLite file")
	flag.Parse()
	sum, err := run(*dsn, *orders, *failRate, *lostAckRate, *verbose)
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
	fmt.Printf("created:    %d orders, each with its order.created event in the same transaction (+1 rolled back)\n", sum.Created)
	fmt.Printf("published:  %d events marked published by the relay\n", sum.Published)
	fmt.Printf("retried:    %d failed attempts (%d refused by the broker, %d delivered but unacknowledged), all retried with backoff\n", sum.FailedAttempts, sum.Refused, sum.LostAcks)
	fmt.Printf("delivered:  %d distinct events in %d deliveries: %d duplicates, which an inbox absorbs\n", sum.Distinct, sum.Deliveries, sum.Deliveries-sum.Distinct)
	fmt.Printf("outbox:     %d pending, %d dead-lettered; the rolled-back order's event was never published\n", sum.Pending, sum.Dead)
}

// summary is what the quickstart observed.
type summary struct {
	Created, Distinct, Deliveries int
	Published, FailedAttempts     int64
	Refused, LostAcks             int64
	Pending, Dead                 int64
	RolledBackDelivered           int
}

func run(mysqlURL string, orders int, failRate, lostAckRate float64, verbose bool) (summary, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	level := slog.LevelError
	if verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	// 1. A database: SQLite in a temporary directory, in WAL mode with
	// immediate transactions so that the producer and the relay queue up;
	// or the MySQL/MariaDB database of -dsn.
	db, d, closeDB, err := openDatabase(mysqlURL)
	if err != nil {
		return summary{}, err
	}
	defer closeDB()
	if err := dialect.Migrate(ctx, db, d, dialect.MigrateOptions{Logger: log}); err != nil {
		return summary{}, err
	}
	ordersDDL := `CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, buyer TEXT NOT NULL, total_cents INTEGER NOT NULL)`
	if d == dialect.MySQL {
		ordersDDL = `CREATE TABLE IF NOT EXISTS orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, buyer VARCHAR(64) NOT NULL, total_cents INTEGER NOT NULL)`
	}
	if _, err := db.ExecContext(ctx, ordersDDL); err != nil {
		return summary{}, err
	}

	// 2. A broker: Watermill's in-process GoChannel, behind a publisher that
	// refuses some events and loses the acknowledgement of others.
	broker := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, watermill.NopLogger{})
	defer broker.Close()
	pub := watermillbroker.NewPublisher(broker, watermillbroker.Options{})
	flaky := &outboxtest.Faulty{
		Inner:             pub,
		FailRate:          failRate,
		FailAfterSendRate: lostAckRate,
		Seed:              7,
	}

	// 3. A consumer that counts deliveries per event ID.
	msgs, err := broker.Subscribe(ctx, "order.created")
	if err != nil {
		return summary{}, err
	}
	var mu sync.Mutex
	deliveries := map[string]int{}
	go func() {
		for m := range msgs {
			mu.Lock()
			deliveries[m.Metadata.Get(core.HeaderEventID)]++
			mu.Unlock()
			m.Ack()
		}
	}()

	// 4. The outbox and its relay, in the same process: Enqueue wakes the
	// relay running on the outbox, so events go out without waiting for
	// the poll interval.
	outbox, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Dialect: d, Logger: log})
	if err != nil {
		return summary{}, err
	}
	relay, err := core.NewRelay(outbox, flaky, core.RelayOptions{
		PollInterval: 100 * time.Millisecond,
		Retry:        core.RetryPolicy{InitialBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
		Logger:       log,
	})
	if err != nil {
		return summary{}, err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()

	// 5. The producer: each order and its event in one transaction. The
	// last order's transaction rolls back: its event must never appear.
	var rolledBackID string // the last one's event ID
	for i := 1; i <= orders+1; i++ {
		id, err := createOrder(ctx, db, outbox, i, i == orders+1)
		if err != nil {
			return summary{}, err
		}
		rolledBackID = id
	}

	// 6. Wait until every committed event arrived and the outbox is empty:
	// an event delivered whose acknowledgement was lost is still pending
	// until its retry succeeds.
	for {
		mu.Lock()
		n := len(deliveries)
		mu.Unlock()
		stats, err := outbox.Stats(ctx)
		if err != nil {
			return summary{}, err
		}
		if n >= orders && stats.Pending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return summary{}, fmt.Errorf("%d of %d events arrived, %d pending: %w", n, orders, stats.Pending, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	stopRelay()
	if err := <-relayDone; err != nil {
		return summary{}, err
	}
	// Give the subscriber a moment for messages already in flight.
	time.Sleep(50 * time.Millisecond)

	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, n := range deliveries {
		total += n
	}
	c, f := relay.Counters(), flaky.Counts()
	stats, err := outbox.Stats(ctx)
	if err != nil {
		return summary{}, err
	}
	return summary{
		Created: orders, Distinct: len(deliveries), Deliveries: total,
		Published: c.Published, FailedAttempts: c.Failed,
		Refused: f.Refused, LostAcks: f.FailedAfterSend,
		Pending: stats.Pending, Dead: stats.Dead,
		RolledBackDelivered: deliveries[rolledBackID],
	}, nil
}

// createOrder writes an order and its event atomically; rollback simulates a
// failure after both writes.
func createOrder(ctx context.Context, db *sql.DB, outbox *sqlxoutbox.Outbox, i int, rollback bool) (eventID string, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `INSERT INTO orders (buyer, total_cents) VALUES (?, ?)`, fmt.Sprintf("buyer-%d", i), 1000+i)
	if err != nil {
		return "", err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return "", err
	}
	ev, err := core.NewEvent("order", fmt.Sprint(id), "order.created", map[string]any{"order_id": id, "total_cents": 1000 + i})
	if err != nil {
		return "", err
	}
	evs := []core.Event{ev}
	if err := outbox.Enqueue(ctx, tx, evs...); err != nil {
		return "", err
	}
	if rollback {
		return evs[0].ID, tx.Rollback()
	}
	return evs[0].ID, tx.Commit()
}

// openDatabase opens a fresh SQLite file in a temporary directory, or the
// MySQL/MariaDB database of mysqlURL; closeDB closes it (and removes the
// directory).
func openDatabase(mysqlURL string) (db *sql.DB, d dialect.Dialect, closeDB func(), err error) {
	if mysqlURL != "" {
		u, err := url.Parse(mysqlURL)
		if err != nil || u.Scheme != "mysql" {
			return nil, d, nil, errors.New("-dsn: want mysql://user:pass@host:3306/db")
		}
		cfg, err := mysql.ParseDSN("tcp(" + u.Host + ")" + u.Path + "?" + u.RawQuery)
		if err != nil {
			return nil, d, nil, err
		}
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			return nil, d, nil, err
		}
		// database/sql keeps two idle connections by default; the
		// producers and the relay would open one per transaction.
		db.SetMaxOpenConns(16)
		db.SetMaxIdleConns(16)
		return db, dialect.MySQL, func() { db.Close() }, nil
	}
	dir, err := os.MkdirTemp("", "txoutbox-quickstart-")
	if err != nil {
		return nil, d, nil, err
	}
	dsn := "file:" + filepath.Join(dir, "shop.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_txlock=immediate"
	if db, err = sql.Open("sqlite", dsn); err != nil {
		os.RemoveAll(dir)
		return nil, d, nil, err
	}
	return db, dialect.SQLite, func() { db.Close(); os.RemoveAll(dir) }, nil
}
