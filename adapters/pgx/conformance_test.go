package pgxoutbox_test

import (
	"log/slog"
	"testing"

	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

var quiet = slog.New(slog.DiscardHandler)

func newStore(t *testing.T) *outboxtest.StoreFixture {
	return fixtures.PGXPostgres(t, fixtures.Options{Logger: quiet, SkipInbox: true})
}

// TestConformance runs the shared store suites on the pgx Outbox, with
// producers writing in pgx transactions: one store serves unordered and
// ordered claims, and wakes the relays of its pool.
func TestConformance(t *testing.T) {
	t.Parallel()
	t.Run("Store", func(t *testing.T) { t.Parallel(); outboxtest.RunStore(t, newStore) })
	t.Run("OrderedStore", func(t *testing.T) { t.Parallel(); outboxtest.RunOrderedStore(t, newStore) })
}

// TestEndToEndRabbitMQ is the real relay from the pgx store through
// RabbitMQ to a subscriber.
func TestEndToEndRabbitMQ(t *testing.T) {
	t.Parallel()
	outboxtest.RunEndToEnd(t, newStore, func(t *testing.T) *outboxtest.BrokerFixture { return fixtures.RabbitMQ(t) })
}

// TestExactlyOnceRabbitMQ is a pgx service end to end: producers enqueue
// in pgx transactions, the relay claims from the pool, RabbitMQ carries
// the events, and consumers deduplicate with the inbox on pgx.
func TestExactlyOnceRabbitMQ(t *testing.T) {
	t.Parallel()
	outboxtest.RunExactlyOnce(t, newStore,
		func(t *testing.T) *outboxtest.BrokerFixture { return fixtures.RabbitMQ(t) },
		func(t *testing.T) *outboxtest.InboxFixture { return fixtures.PGXInbox(t) })
}
