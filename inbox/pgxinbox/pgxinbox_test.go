package pgxinbox_test

import (
	"testing"

	"github.com/txoutbox/txoutbox/internal/fixtures"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// TestConformance runs the inbox suite on pgx: one effect per event and
// consumer, rollback with a failing or panicking handler, concurrent
// duplicates taking effect once, retention.
func TestConformance(t *testing.T) {
	t.Parallel()
	outboxtest.RunInbox(t, func(t *testing.T) *outboxtest.InboxFixture { return fixtures.PGXInbox(t) })
}
