package logrelay_test

import (
	"testing"

	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

func newStore(t *testing.T) *outboxtest.StoreFixture {
	return fixtures.LogPostgres(t, fixtures.Options{SkipInbox: true})
}

func rabbit(t *testing.T) *outboxtest.BrokerFixture { return fixtures.RabbitMQ(t) }

// TestEndToEndRabbitMQ: log mode from PostgreSQL's WAL through RabbitMQ.
func TestEndToEndRabbitMQ(t *testing.T) {
	t.Parallel()
	outboxtest.RunEndToEnd(t, newStore, rabbit)
}

// TestExactlyOnceRabbitMQ: log mode under a publisher that fails 10 % of
// events (they take the table's retry path), reports failure after
// sending, and duplicates; consumers with the inbox see each event take
// effect once.
func TestExactlyOnceRabbitMQ(t *testing.T) {
	t.Parallel()
	outboxtest.RunExactlyOnce(t, newStore, rabbit,
		func(t *testing.T) *outboxtest.InboxFixture { return fixtures.PGXInbox(t) })
}

// TestScheduled: log mode hands a scheduled event to the table, whose
// relay publishes it at its time, once, across a relay restart.
func TestScheduled(t *testing.T) {
	t.Parallel()
	outboxtest.RunScheduled(t, newStore)
}
