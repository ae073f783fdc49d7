package sqlxoutbox_test

import (
	"testing"

	outboxtest "github.com/txoutbox/txoutbox/testing"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
)

// TestConformance runs the shared store suite against PostgreSQL and SQLite.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.RunStore(t, func(t *testing.T) *outboxtest.StoreFixture {
				// SQLite too: its claims are leases, so two open claims
				// never share an event either (StoreFixture.ConcurrentClaims).
				return newEnv(t, b, sqlxoutbox.Options{}).s.StoreFixture()
			})
		})
	}
}
