package inbox_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

var quiet = slog.New(slog.DiscardHandler)

// newProducer is the producer side of the end-to-end test: the sqlx
// outbox on a fresh PostgreSQL database, next to an orders table that each
// producer transaction writes too.
func newProducer(t *testing.T) *outboxtest.StoreFixture {
	return newProducerOn(t, sqlx.NewDb(testenv.OpenPostgres(t), "pgx"), dialect.Postgres)
}

// newSQLiteProducer is newProducer on SQLite, opened as sqlxoutbox
// recommends (BEGIN IMMEDIATE, so that producers queue for the lock).
func newSQLiteProducer(t *testing.T) *outboxtest.StoreFixture {
	db, err := sqlx.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "outbox.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return newProducerOn(t, db, dialect.SQLite)
}

func newProducerOn(t *testing.T, db *sqlx.DB, d dialect.Dialect) *outboxtest.StoreFixture {
	t.Helper()
	ctx := t.Context()
	if err := dialect.Migrate(ctx, db.DB, d, dialect.MigrateOptions{SkipInbox: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, events INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
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
			if _, err := tx.ExecContext(ctx, db.Rebind(`INSERT INTO orders (id, events) VALUES (?, ?)`), evs[0].ID, len(evs)); err != nil {
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

// newConsumer is the consumer side: the inbox on its own PostgreSQL
// database, with the consumer's own effects table.
func newConsumer(t *testing.T) *outboxtest.InboxFixture {
	f, _, _ := backends[0].newSQLFixture(t, false)
	return f
}

func TestExactlyOnceGoChannel(t *testing.T) {
	t.Parallel()
	outboxtest.RunExactlyOnce(t, newProducer, goChannelBroker, newConsumer)
}

func goChannelBroker(t *testing.T) *outboxtest.BrokerFixture {
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { ps.Close() })
	return &outboxtest.BrokerFixture{Publisher: core.NewWatermillPublisher(ps, nil), Subscriber: ps}
}

// TestExactlyOnceSQLite is the embedded setup: producer and consumer each
// on a SQLite file, the broker in process.
func TestExactlyOnceSQLite(t *testing.T) {
	t.Parallel()
	outboxtest.RunExactlyOnce(t, newSQLiteProducer, goChannelBroker, func(t *testing.T) *outboxtest.InboxFixture {
		f, _, _ := backends[1].newSQLFixture(t, true)
		return f
	})
}

func TestExactlyOnceRabbitMQ(t *testing.T) {
	t.Parallel()
	outboxtest.RunExactlyOnce(t, newProducer, func(t *testing.T) *outboxtest.BrokerFixture {
		url := testenv.AMQPURL(t)
		pub, err := amqpbroker.NewPublisher(amqpbroker.Options{URL: url, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		// One subscriber, one consumer group: both routers of the suite
		// consume the same durable queue and compete for its messages.
		sub, err := amqpbroker.NewSubscriber(amqpbroker.SubscriberOptions{
			URL: url, Consumer: "inventory-" + testenv.RandomSuffix(), Logger: quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Close() })
		return &outboxtest.BrokerFixture{Publisher: pub, Subscriber: sub}
	}, newConsumer)
}
