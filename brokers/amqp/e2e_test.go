package amqpbroker_test

import (
	"testing"

	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/tier"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// newStore is a fresh PostgreSQL outbox (adapters/sqlx) with an orders
// table that producers write next to their events.
func newStore(t *testing.T) *outboxtest.StoreFixture {
	t.Helper()
	return fixtures.SQLXPostgres(t, fixtures.Options{Logger: quiet})
}

// newBroker is a publisher and a subscriber on the test RabbitMQ, able to
// stop and start it for the outage test.
func newBroker(t *testing.T) *outboxtest.BrokerFixture {
	return &outboxtest.BrokerFixture{
		Publisher:  newPublisher(t, amqpbroker.Options{Reconnect: fastReconnect}),
		Subscriber: newSubscriber(t, amqpbroker.SubscriberOptions{Reconnect: fastReconnect}),
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

// The real relay from MariaDB through RabbitMQ to a subscriber.
func TestEndToEndMariaDB(t *testing.T) {
	outboxtest.RunEndToEnd(t, func(t *testing.T) *outboxtest.StoreFixture {
		return fixtures.SQLXMySQL(t, fixtures.Options{Logger: quiet})
	}, newBroker)
}

// Events enqueued while RabbitMQ is down stay in the PostgreSQL outbox with
// growing attempts and last_error, and all arrive once it is back.
func TestOutageEndToEndPostgres(t *testing.T) {
	tier.SkipShort(t) // it stops the RabbitMQ that the edit loop's other packages share
	outboxtest.RunOutage(t, newStore, newBroker)
}
