package amqpbroker_test

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

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

// newBroker is a publisher and a subscriber on the test RabbitMQ, able to
// stop and start it for the outage test.
func newBroker(t *testing.T) *outboxtest.BrokerFixture {
	return &outboxtest.BrokerFixture{
		Publisher:  newPublisher(t, amqpbroker.Options{Reconnect: fastReconnect}),
		Subscriber: newSubscriber(t, amqpbroker.SubscriberOptions{Reconnect: fastReconnect}),
		Ordered:    true,
		Stop:       func(t *testing.T) { testenv.RabbitMQCtl(t, "stop_app") },
		Start: func(t *testing.T) {
			testenv.RabbitMQCtl(t, "start_app")
			testenv.RabbitMQCtl(t, "await_startup")
		},
	}
}

// The real relay from PostgreSQL through RabbitMQ to a subscriber.
func TestEndToEndPostgres(t *testing.T) {
	outboxtest.RunEndToEnd(t, newStore, newBroker)
}

// Events enqueued while RabbitMQ is down stay in the PostgreSQL outbox with
// growing attempts and last_error, and all arrive once it is back.
func TestOutageEndToEndPostgres(t *testing.T) {
	outboxtest.RunOutage(t, newStore, newBroker)
}
