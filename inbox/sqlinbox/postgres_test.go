package sqlinbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// TestPostgresDuplicateWaitsOnRowLock shows why concurrent duplicates take
// effect once on PostgreSQL: while the first delivery's transaction holds
// its uncommitted inbox row, the second delivery's INSERT ... ON CONFLICT DO
// NOTHING cannot decide whether it conflicts, so it waits on the first
// transaction's id (pg_stat_activity: wait_event_type Lock, wait_event
// transactionid). When the first commits, the INSERT sees the conflict,
// affects no row, and the handler is skipped.
func TestPostgresDuplicateWaitsOnRowLock(t *testing.T) {
	t.Parallel()
	f, ib, db := fixtures.InboxBackends[0].NewSQLInbox(t, false)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	id := uuid.NewString()
	inside, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := ib.Process(ctx, "c1", id, func(ctx context.Context) error {
			if err := f.Effect(ctx, id); err != nil {
				return err
			}
			close(inside)
			<-release
			return nil
		})
		first <- err
	}()
	<-inside
	type result struct {
		processed bool
		err       error
	}
	second := make(chan result, 1)
	go func() {
		ok, err := ib.Process(ctx, "c1", id, func(ctx context.Context) error { return f.Effect(ctx, id) })
		second <- result{ok, err}
	}()

	// Find the second delivery waiting on the first's transaction.
	var waitType, waitEvent string
	wait.For(t, "the second delivery's INSERT to wait on a lock", func() (bool, any) {
		err := db.QueryRowContext(ctx, `SELECT wait_event_type, wait_event FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'INSERT INTO "processed_events"%' AND state = 'active'`).
			Scan(&waitType, &waitEvent)
		return err == nil && waitType == "Lock", fmt.Sprintf("%q %q %v", waitType, waitEvent, err)
	})
	if waitEvent != "transactionid" {
		t.Errorf("second INSERT waits on %q, want transactionid (the first delivery's transaction)", waitEvent)
	}
	select {
	case r := <-second:
		t.Fatalf("second delivery finished (%v, %v) while the first still held its row", r.processed, r.err)
	default:
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first delivery: %v", err)
	}
	r := <-second
	if r.err != nil || r.processed {
		t.Fatalf("second delivery = (%v, %v), want (false, nil): it saw the committed row and skipped", r.processed, r.err)
	}
	effects, err := f.Effects(ctx)
	if err != nil || effects[id] != 1 {
		t.Fatalf("effects %v (%v), want one", effects, err)
	}
}
