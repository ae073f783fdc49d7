package pgxoutbox_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pgxoutbox "github.com/txoutbox/txoutbox/adapters/pgx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// Create an order and its "order.created" event in one pgx.Tx, then let a
// relay on the pool publish it. The broker here is a function that prints.
// The example runs in a schema of its own in the database of
// $TXOUTBOX_PG_DSN (make test sets it) and drops it at the end.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("TXOUTBOX_PG_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := "pgxoutbox_example_" + strconv.Itoa(os.Getpid())
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck
	silent := slog.New(slog.DiscardHandler)
	table := schema + ".outbox_events"
	if err := pgxoutbox.Migrate(ctx, pool, dialect.MigrateOptions{Table: table, SkipInbox: true,
		MigrationsTable: schema + ".txoutbox_migrations", Logger: silent}); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".orders (id TEXT PRIMARY KEY, total_cents BIGINT NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	outbox, err := pgxoutbox.New(pool, pgxoutbox.Options{Table: table, Logger: silent})
	if err != nil {
		log.Fatal(err)
	}

	// The business write and the event commit or roll back together.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".orders (id, total_cents) VALUES ($1, $2)", "o-1", 4200); err != nil {
			return err
		}
		ev, err := core.NewEvent("order", "o-1", "order.created", map[string]any{"order_id": "o-1", "total_cents": 4200})
		if err != nil {
			return err
		}
		return outbox.Enqueue(ctx, tx, ev)
	})
	if err != nil {
		log.Fatal(err)
	}

	// A relay publishes what committed; Drain stops once nothing is due.
	print := core.PublisherFunc(func(_ context.Context, evs []core.Event) error {
		for _, ev := range evs {
			fmt.Printf("published %s for %s %s: %s\n", ev.EventType, ev.AggregateType, ev.AggregateID, ev.Payload)
		}
		return nil
	})
	relay, err := core.NewRelay(outbox, print, core.RelayOptions{Logger: silent})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.Drain(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// published order.created for order o-1: {"order_id": "o-1", "total_cents": 4200}
}
