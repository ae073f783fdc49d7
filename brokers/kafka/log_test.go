package kafkabroker_test

import (
	"testing"

	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// newLogStore is a fresh PostgreSQL outbox in log mode (package logrelay):
// the suites run the log relay, with the sqlx store as its retry path.
func newLogStore(t *testing.T) *outboxtest.StoreFixture {
	t.Helper()
	return fixtures.LogPostgres(t, fixtures.Options{Logger: quiet, SkipInbox: true})
}

// Log mode from PostgreSQL's WAL through Kafka to a consumer group.
func TestLogModeEndToEnd(t *testing.T) {
	t.Parallel()
	outboxtest.RunEndToEnd(t, newLogStore, newBroker)
}

// Log mode through Kafka under a faulty publisher (failed events take the
// table's retry path), consumers deduplicating with the inbox: every
// committed event takes effect once.
func TestLogModeExactlyOnce(t *testing.T) {
	t.Parallel()
	outboxtest.RunExactlyOnce(t, newLogStore, newBroker,
		func(t *testing.T) *outboxtest.InboxFixture { return fixtures.PGXInbox(t) })
}
