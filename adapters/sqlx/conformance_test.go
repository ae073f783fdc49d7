package sqlxoutbox_test

import (
	"testing"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// TestConformance runs the shared store suites against PostgreSQL and
// SQLite: the one Outbox serves unordered and ordered claims.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			newStore := func(t *testing.T) *outboxtest.StoreFixture {
				return newEnv(t, b, sqlxoutbox.Options{}).s.StoreFixture()
			}
			t.Run("Store", func(t *testing.T) { t.Parallel(); outboxtest.RunStore(t, newStore) })
			t.Run("OrderedStore", func(t *testing.T) { t.Parallel(); outboxtest.RunOrderedStore(t, newStore) })
			t.Run("Scheduled", func(t *testing.T) { t.Parallel(); outboxtest.RunScheduled(t, newStore) })
		})
	}
}
