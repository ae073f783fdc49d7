package sqlxoutbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
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
				e := newEnv(t, b, sqlxoutbox.Options{})
				return &outboxtest.StoreFixture{
					Store: e.box,
					Enqueue: func(ctx context.Context, evs []core.Event, commit bool) error {
						tx, err := e.db.BeginTxx(ctx, nil)
						if err != nil {
							return err
						}
						defer tx.Rollback()
						if _, err := tx.ExecContext(ctx, e.db.Rebind("INSERT INTO orders (id, total) VALUES (?, ?)"), evs[0].ID, len(evs)); err != nil {
							return err
						}
						if err := e.box.Enqueue(ctx, tx, evs...); err != nil {
							return err
						}
						if !commit {
							return tx.Rollback()
						}
						return tx.Commit()
					},
					Get: e.box.Get,
					Backdate: func(ctx context.Context, id string, age time.Duration) error {
						return e.backdate(ctx, id, age)
					},
					Stats:   e.box,
					Cleaner: e.box,
					// SQLite too: its claims are leases, so two open claims
					// never share an event either.
					ConcurrentClaims: true,
				}
			})
		})
	}
}
