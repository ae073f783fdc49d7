package sqlinbox_test

import (
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

var quiet = slog.New(slog.DiscardHandler)

// newProducer is the producer side of the end-to-end test: the sqlx
// outbox on a fresh PostgreSQL database, next to an orders table that each
// producer transaction writes too.
func newProducer(t *testing.T) *outboxtest.StoreFixture {
	return fixtures.SQLXPostgres(t, fixtures.Options{SkipInbox: true, Logger: quiet})
}

// newSQLiteProducer is newProducer on SQLite, opened as sqlxoutbox
// recommends (BEGIN IMMEDIATE, so that producers queue for the lock).
func newSQLiteProducer(t *testing.T) *outboxtest.StoreFixture {
	return fixtures.SQLXSQLite(t, fixtures.Options{SkipInbox: true, Logger: quiet})
}

// newConsumer is the consumer side: the inbox on its own PostgreSQL
// database, with the consumer's own effects table.
func newConsumer(t *testing.T) *outboxtest.InboxFixture {
	f, _, _ := fixtures.InboxBackends[0].NewSQLInbox(t, false)
	return f
}

func TestExactlyOnceGoChannel(t *testing.T) {
	t.Parallel()
	outboxtest.RunExactlyOnce(t, newProducer, goChannelBroker, newConsumer)
}

func goChannelBroker(t *testing.T) *outboxtest.BrokerFixture {
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { ps.Close() })
	return &outboxtest.BrokerFixture{Publisher: watermillbroker.NewPublisher(ps, watermillbroker.Options{}), Subscriber: ps}
}

// TestExactlyOnceSQLite is the embedded setup: producer and consumer each
// on a SQLite file, the broker in process.
func TestExactlyOnceSQLite(t *testing.T) {
	t.Parallel()
	outboxtest.RunExactlyOnce(t, newSQLiteProducer, goChannelBroker, func(t *testing.T) *outboxtest.InboxFixture {
		f, _, _ := fixtures.InboxBackends[1].NewSQLInbox(t, true)
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
