package memoutbox_test

import (
	"context"
	"testing"

	memoutbox "github.com/txoutbox/txoutbox/adapters/memory"
	"github.com/txoutbox/txoutbox/core"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// The reference store passes the suites every store passes.
func TestConformance(t *testing.T) {
	t.Parallel()
	newStore := func(t *testing.T) *outboxtest.StoreFixture { return fixture(memoutbox.New(memoutbox.Options{})) }
	t.Run("Store", func(t *testing.T) { t.Parallel(); outboxtest.RunStore(t, newStore) })
	t.Run("OrderedStore", func(t *testing.T) { t.Parallel(); outboxtest.RunOrderedStore(t, newStore) })
	t.Run("Scheduled", func(t *testing.T) { t.Parallel(); outboxtest.RunScheduled(t, newStore) })
}

func fixture(s *memoutbox.Store) *outboxtest.StoreFixture {
	return &outboxtest.StoreFixture{
		Store: s,
		Enqueue: func(ctx context.Context, evs []core.Event, commit bool) error {
			tx := s.Begin()
			if err := s.Enqueue(ctx, tx, evs...); err != nil {
				_ = tx.Rollback()
				return err
			}
			if !commit {
				return tx.Rollback()
			}
			return tx.Commit()
		},
		EnqueueThenCommit: func(ctx context.Context, evs []core.Event) (error, error) {
			tx := s.Begin()
			enqErr := s.Enqueue(ctx, tx, evs...)
			return enqErr, tx.Commit()
		},
		Get:      s.Get,
		Backdate: s.Backdate,
		RetryDead: func(ctx context.Context, id string) error {
			_, err := s.RetryDead(ctx, id)
			return err
		},
		Crash: func(context.Context) error { s.Crash(); return nil },
	}
}
