package snsbroker_test

import (
	"testing"

	snsbroker "github.com/txoutbox/txoutbox/brokers/sns"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/sqstest"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// quiet keeps the publisher's and the store's logs out of test output; set
// TXOUTBOX_TEST_LOG=1 to see them.
var quiet = fixtures.Quiet()

// newStore is a fresh PostgreSQL outbox (adapters/sqlx) with an orders
// table that producers write next to their events.
func newStore(t *testing.T) *outboxtest.StoreFixture {
	t.Helper()
	return fixtures.SQLXPostgres(t, fixtures.Options{Logger: quiet})
}

// newOutageBroker publishes with PublishBatch through front, which can cut
// every connection (the endpoint is down) and take them again.
func newOutageBroker(t *testing.T) *outboxtest.BrokerFixture {
	g := sqstest.New(t)
	f := newFront(t, g.Endpoint)
	pub, err := snsbroker.NewPublisher(newSNSClient(t, f.URL()), snsbroker.Options{CreateTopics: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	sub := &sqstest.Subscriber{T: t, G: g, Raw: true}
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
			outboxtest.RunEndToEnd(t, newStore, newBroker)
		})
	}
}

// Events enqueued while the SNS endpoint is unreachable stay in the
// PostgreSQL outbox with growing attempts and last_error, and all arrive
// once it is back.
func TestEndpointDownEndToEndPostgres(t *testing.T) {
	outboxtest.RunOutage(t, newStore, newOutageBroker)
}
