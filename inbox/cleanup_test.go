package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

func TestRunCleanupDeletesUntilCancelled(t *testing.T) {
	f, ib, _ := sqliteFixture(t)
	ctx := t.Context()
	old := uuid.NewString()
	if _, err := ib.Process(ctx, "c1", old, func(ctx context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := f.Backdate(ctx, "c1", old, 50*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	var deleted atomic.Int64
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- inbox.RunCleanup(rctx, ib, inbox.CleanupOptions{Interval: 10 * time.Millisecond, OnProgress: func(n int64) { deleted.Add(n) }})
	}()
	wait.Until(t, "the cleanup's first delete", func() bool { return deleted.Load() != 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunCleanup = %v, want nil after cancel", err)
	}
	if deleted.Load() != 1 {
		t.Fatalf("RunCleanup deleted %d, want 1", deleted.Load())
	}
	inboxProcessed(t, f, "c1", old, false)
}

func TestCleanupRejectsBadOptions(t *testing.T) {
	_, ib, _ := sqliteFixture(t)
	if _, err := inbox.Cleanup(t.Context(), nil, inbox.CleanupOptions{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("Cleanup(nil) = %v, want ErrInvalidOptions", err)
	}
	if _, err := inbox.Cleanup(t.Context(), ib, inbox.CleanupOptions{BatchSize: -1}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("Cleanup(BatchSize -1) = %v, want ErrInvalidOptions", err)
	}
	if err := inbox.RunCleanup(t.Context(), ib, inbox.CleanupOptions{Retention: -time.Hour}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("RunCleanup(negative Retention) = %v, want ErrInvalidOptions", err)
	}
	if _, err := ib.DeleteProcessed(t.Context(), time.Now(), 0); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("DeleteProcessed(limit 0) = %v, want ErrInvalidOptions", err)
	}
}
