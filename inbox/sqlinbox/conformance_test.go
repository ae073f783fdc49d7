package sqlinbox_test

import (
	"testing"

	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

func TestConformance(t *testing.T) {
	for _, b := range fixtures.InboxBackends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			outboxtest.RunInbox(t, func(t *testing.T) *outboxtest.InboxFixture {
				f, _, _ := b.NewSQLInbox(t, false)
				return f
			})
		})
		t.Run(b.Name+"Sqlx", func(t *testing.T) {
			t.Parallel()
			outboxtest.RunInbox(t, func(t *testing.T) *outboxtest.InboxFixture {
				f, _, _ := b.NewSQLInbox(t, true)
				return f
			})
		})
	}
}
