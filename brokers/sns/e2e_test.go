package snsbroker_test

import (
	"context"
	"log/slog"
	"os"
	"testing"

	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	snsbroker "github.com/txoutbox/txoutbox/brokers/sns"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// quiet keeps the publisher's and the store's logs out of test output; set
// TXOUTBOX_TEST_LOG=1 to see them.
var quiet = func() *slog.Logger {
	if os.Getenv("TXOUTBOX_TEST_LOG") != "" {
		return slog.Default()
	}
	return slog.New(slog.DiscardHandler)
}()

// newStore is a fresh PostgreSQL outbox (adapters/sqlx) with an orders
// table that producers write next to their events.
func newStore(t *testing.T) *outboxtest.StoreFixture {
	t.Helper()
	ctx := context.Background()
	db := sqlx.NewDb(testenv.OpenPostgres(t), "pgx")
	if err := dialect.Migrate(ctx, db.DB, dialect.Postgres, dialect.MigrateOptions{Logger: quiet}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	db.MustExec("CREATE TABLE orders (id TEXT PRIMARY KEY, events INTEGER NOT NULL)")
	box, err := sqlxoutbox.New(db, sqlxoutbox.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return &outboxtest.StoreFixture{
		Store: box,
		Enqueue: func(ctx context.Context, evs []core.Event, commit bool) error {
			tx, err := db.BeginTxx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, events) VALUES ($1, $2)", evs[0].ID, len(evs)); err != nil {
				return err
			}
			if err := box.Enqueue(ctx, tx, evs...); err != nil {
				return err
			}
			if !commit {
				return tx.Rollback()
			}
			return tx.Commit()
		},
		Get:              box.Get,
		Stats:            box,
		Cleaner:          box,
		ConcurrentClaims: true,
	}
}

// newOutageBroker publishes with PublishBatch through front, which can cut
// every connection (the endpoint is down) and take them again.
func newOutageBroker(t *testing.T) *outboxtest.BrokerFixture {
	g := newGoaws(t)
	f := newFront(t, g.endpoint)
	pub, err := snsbroker.New(newSNSClient(t, f.URL()), snsbroker.Options{CreateTopics: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	sub := &Subscriber{t: t, g: g, raw: true}
	t.Cleanup(func() { sub.Close() })
	return &outboxtest.BrokerFixture{
		Publisher: pub, Subscriber: sub, Topic: snsbroker.TopicName,
		Stop:  func(*testing.T) { f.down.Store(true) },
		Start: func(*testing.T) { f.down.Store(false) },
	}
}

// The real relay from PostgreSQL through SNS (goaws; PublishBatch through
// front) to SQS.
func TestEndToEndPostgres(t *testing.T) {
	for name, k := range map[string]fixtureKind{
		"Publish":   {raw: true},
		"Batch":     {batch: true},
		"BatchFIFO": {batch: true, fifo: true, raw: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			newBroker := newFixture(k)
			outboxtest.RunEndToEnd(t, newStore, func(t *testing.T) *outboxtest.BrokerFixture {
				b := newBroker(t)
				// The suite's relay runs two workers in unordered mode,
				// whose concurrent batches may interleave one aggregate's
				// events; FIFO order is proven by RunPublisher and
				// TestFIFO, where one caller publishes.
				b.Ordered = false
				return b
			})
		})
	}
}

// Events enqueued while the SNS endpoint is unreachable stay in the
// PostgreSQL outbox with growing attempts and last_error, and all arrive
// once it is back.
func TestOutageEndToEndPostgres(t *testing.T) {
	outboxtest.RunOutage(t, newStore, newOutageBroker)
}
