package kafkabroker_test

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/tier"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// newStore is a fresh PostgreSQL outbox (adapters/sqlx) with an orders
// table that producers write next to their events.
func newStore(t *testing.T) *outboxtest.StoreFixture {
	t.Helper()
	return fixtures.SQLXPostgres(t, fixtures.Options{Logger: quiet})
}

// newBroker is a publisher and a consumer-group subscriber on a fresh
// kfake cluster that keeps its state in a directory, so that Stop and Start
// are a broker restart on the same ports.
func newBroker(t *testing.T) *outboxtest.BrokerFixture {
	cl := newCluster(t, kfake.DataDir(t.TempDir()))
	return &outboxtest.BrokerFixture{
		Publisher:  newPublisher(t, cl.addrs, kafkabroker.Options{}),
		Subscriber: newSubscriber(t, cl.addrs, ""),
		Stop:       func(t *testing.T) { cl.stop() },
		Start:      func(t *testing.T) { cl.start(t) },
	}
}

// The real relay from PostgreSQL through Kafka to a consumer group.
func TestEndToEndPostgres(t *testing.T) {
	outboxtest.RunEndToEnd(t, newStore, newBroker)
}

// Events enqueued while the Kafka cluster is down stay in the PostgreSQL
// outbox with growing attempts and last_error, and all arrive once it is
// back.
func TestClusterDownEndToEndPostgres(t *testing.T) {
	tier.SkipShort(t) // TestPublisherRecoversAfterClusterDown stays in the edit loop
	outboxtest.RunOutage(t, newStore, newBroker)
}
