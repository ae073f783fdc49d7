package sqlxoutbox_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// Create an order and its "order.created" event in one transaction, then let
// a relay publish the event. Here the database is SQLite and the broker is a
// function that prints; with PostgreSQL only the driver and DSN change.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "txoutbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlx.Open("sqlite", "file:"+filepath.Join(dir, "shop.db")+
		"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	silent := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := dialect.Migrate(ctx, db.DB, dialect.SQLite, dialect.MigrateOptions{Logger: silent}); err != nil {
		log.Fatal(err)
	}
	db.MustExec("CREATE TABLE orders (id TEXT PRIMARY KEY, total_cents INTEGER NOT NULL)")

	box, err := sqlxoutbox.New(db, sqlxoutbox.Options{}) // dialect from the driver name
	if err != nil {
		log.Fatal(err)
	}

	// The business write and the event commit or roll back together.
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, total_cents) VALUES (?, ?)", "o-1", 4200); err != nil {
		log.Fatal(err)
	}
	ev, err := core.NewEvent("order", "o-1", "order.created", map[string]any{"order_id": "o-1", "total_cents": 4200})
	if err != nil {
		log.Fatal(err)
	}
	if err := box.Enqueue(ctx, tx, ev); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	broker := core.PublisherFunc(func(ctx context.Context, evs []core.Event) error {
		for _, ev := range evs {
			fmt.Printf("published %s for %s %s: %s\n", ev.EventType, ev.AggregateType, ev.AggregateID, ev.Payload)
		}
		return nil
	})
	relay, err := core.NewRelay(box, broker, core.RelayOptions{Logger: silent})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.Drain(ctx); err != nil { // a service runs relay.Run(ctx) instead
		log.Fatal(err)
	}
	stats, err := box.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending:", stats.Pending)
	// Output:
	// published order.created for order o-1: {"order_id":"o-1","total_cents":4200}
	// pending: 0
}

// Write an order and its event with one call. On PostgreSQL the event's
// INSERT rides on the order's statement (one round trip, the cheapest way to
// add an outbox to a short transaction); on SQLite, as here, the same call
// writes them one after the other.
func ExampleOutbox_ExecWithEvents() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "txoutbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlx.Open("sqlite", "file:"+filepath.Join(dir, "shop.db")+
		"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	silent := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := dialect.Migrate(ctx, db.DB, dialect.SQLite, dialect.MigrateOptions{Logger: silent}); err != nil {
		log.Fatal(err)
	}
	db.MustExec("CREATE TABLE orders (id TEXT PRIMARY KEY, total_cents INTEGER NOT NULL)")
	box, err := sqlxoutbox.New(db, sqlxoutbox.Options{})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	ev, err := core.NewEvent("order", "o-7", "order.created", map[string]any{"order_id": "o-7", "total_cents": 990})
	if err != nil {
		log.Fatal(err)
	}
	// On PostgreSQL: "INSERT INTO orders (id, total_cents) VALUES ($1, $2)".
	res, err := box.ExecWithEvents(ctx, tx, "INSERT INTO orders (id, total_cents) VALUES (?, ?)", []any{"o-7", 990}, ev)
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	n, _ := res.RowsAffected()
	stats, err := box.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders written:", n, "events pending:", stats.Pending)
	// Output:
	// orders written: 1 events pending: 1
}
