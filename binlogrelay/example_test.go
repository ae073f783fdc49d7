package binlogrelay_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strconv"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/binlogrelay"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/mysqldsn"
)

// Log mode on a MariaDB database of its own, made from $TXOUTBOX_MYSQL_DSN
// (make test sets it; the server writes a row-format binlog) and dropped at
// the end: set it up, run the relay, and enqueue as in table mode. The
// broker here is a function that prints.
func Example() {
	ctx := context.Background()
	dsn, drop := exampleDatabase(ctx)
	defer drop()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	silent := slog.New(slog.DiscardHandler)
	if err := dialect.Migrate(ctx, db, dialect.MySQL, dialect.MigrateOptions{SkipInbox: true, Logger: silent}); err != nil {
		log.Fatal(err)
	}
	outbox, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Dialect: dialect.MySQL, Logger: silent})
	if err != nil {
		log.Fatal(err)
	}
	published := make(chan core.Event, 1)
	pub := core.PublisherFunc(func(_ context.Context, evs []core.Event) error {
		for _, ev := range evs {
			published <- ev
		}
		return nil
	})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// README: binlog-mode
	// Once: the stream's start position, then published_at's default that
	// hands producers' rows to the binlog (the CLI: txoutbox migrate --mode log).
	names := binlogrelay.Names{}
	if err := binlogrelay.Setup(ctx, dsn, names); err != nil {
		log.Fatal(err)
	}
	// The relay reads the binlog; the store is its retry path.
	relay, err := binlogrelay.New(outbox, pub, binlogrelay.Options{DSN: dsn, Names: names})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }() // until ctx ends

	// Producers do not change: the event goes in the business transaction.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	ev, err := core.NewEvent("order", "o-1", "order.created", map[string]any{"total_cents": 4200})
	if err != nil {
		log.Fatal(err)
	}
	if err := outbox.Enqueue(ctx, tx, ev); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	// README: end

	select {
	case got := <-published:
		fmt.Println("published", got.EventType, got.AggregateID, string(got.Payload))
	case <-time.After(30 * time.Second):
		fmt.Println("nothing published")
	}
	cancel()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output: published order.created o-1 {"total_cents":4200}
}

// exampleDatabase creates a database on $TXOUTBOX_MYSQL_DSN's server and
// returns its DSN (the driver's form) and a function that drops it.
func exampleDatabase(ctx context.Context) (string, func()) {
	cfg, err := mysqldsn.Config(os.Getenv("TXOUTBOX_MYSQL_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	adb, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		log.Fatal(err)
	}
	name := "binlog_example_" + strconv.Itoa(os.Getpid())
	if _, err := adb.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		log.Fatal(err)
	}
	cfg.DBName = name
	return cfg.FormatDSN(), func() {
		_, _ = adb.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name)
		adb.Close()
	}
}
