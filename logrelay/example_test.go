package logrelay_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/logrelay"
)

// Log mode on a database of its own, made from $TXOUTBOX_PG_DSN (make test
// sets it; the server needs wal_level = logical) and dropped at the end:
// set it up, run the relay, and enqueue as in table mode. The broker here
// is a function that prints.
func Example() {
	ctx := context.Background()
	dsn, drop := exampleDatabase(ctx)
	defer drop()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	silent := slog.New(slog.DiscardHandler)
	if err := dialect.Migrate(ctx, db, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: silent}); err != nil {
		log.Fatal(err)
	}
	outbox, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Logger: silent})
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
	slot := "example_" + strconv.Itoa(os.Getpid())
	defer logrelay.Teardown(context.Background(), dsn, logrelay.Names{Slot: slot}, logrelay.TeardownOptions{Force: true}) //nolint:errcheck
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// README: log-mode
	// Once: the slot, then the trigger that sends each insert into the
	// outbox table to the WAL (the CLI: txoutbox migrate --mode log).
	names := logrelay.Names{Slot: slot}
	if err := logrelay.Setup(ctx, dsn, names); err != nil {
		log.Fatal(err)
	}
	// The relay streams the slot; the store is its retry path.
	relay, err := logrelay.New(outbox, pub, logrelay.Options{ConnString: dsn, Names: names})
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
	// Output: published order.created o-1 {"total_cents": 4200}
}

// exampleDatabase creates a database next to $TXOUTBOX_PG_DSN's and returns
// its DSN and a function that drops it.
func exampleDatabase(ctx context.Context) (string, func()) {
	admin := os.Getenv("TXOUTBOX_PG_DSN")
	adb, err := sql.Open("pgx", admin)
	if err != nil {
		log.Fatal(err)
	}
	name := "logrelay_example_" + strconv.Itoa(os.Getpid())
	if _, err := adb.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		log.Fatal(err)
	}
	u, err := url.Parse(admin)
	if err != nil {
		log.Fatal(err)
	}
	u.Path = "/" + name
	return u.String(), func() {
		_, _ = adb.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		adb.Close()
	}
}
