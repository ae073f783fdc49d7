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
		done <- inbox.RunCleanup(rctx, ib, core.CleanupOptions{Interval: 10 * time.Millisecond, OnProgress: func(n int64) { deleted.Add(n) }})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for deleted.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
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
	if _, err := inbox.Cleanup(t.Context(), nil, core.CleanupOptions{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("Cleanup(nil) = %v, want ErrInvalidOptions", err)
	}
	if _, err := inbox.Cleanup(t.Context(), ib, core.CleanupOptions{BatchSize: -1}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("Cleanup(BatchSize -1) = %v, want ErrInvalidOptions", err)
	}
	if err := inbox.RunCleanup(t.Context(), ib, core.CleanupOptions{Retention: -time.Hour}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("RunCleanup(negative Retention) = %v, want ErrInvalidOptions", err)
	}
	if _, err := ib.DeleteProcessed(t.Context(), time.Now(), 0); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("DeleteProcessed(limit 0) = %v, want ErrInvalidOptions", err)
	}
}

func TestNewSQLOptions(t *testing.T) {
	db := openSQLite(t, false)
	if _, err := inbox.NewSQL(nil, inbox.SQLOptions{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("NewSQL(nil) = %v, want ErrInvalidOptions", err)
	}
	if _, err := inbox.NewSQL(db, inbox.SQLOptions{Table: "x; DROP TABLE y"}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("NewSQL(bad table) = %v, want ErrInvalidOptions", err)
	}
	ib, err := inbox.NewSQL(db, inbox.SQLOptions{Table: "consumer_inbox"})
	if err != nil {
		t.Fatal(err)
	}
	if ib.Table() != "consumer_inbox" || ib.Dialect().Name() != "sqlite" {
		t.Errorf("Table %q, Dialect %v; want consumer_inbox, sqlite", ib.Table(), ib.Dialect())
	}
	// The DSN of this database sets no busy_timeout: CheckSQLite says so.
	if d, err := ib.CheckSQLite(t.Context()); err != nil || d != 0 {
		t.Errorf("CheckSQLite = (%v, %v), want (0, nil)", d, err)
	}
	if d, err := inbox.NewSQL(openSQLite(t, true), inbox.SQLOptions{}); err != nil {
		t.Fatal(err)
	} else if got, err := d.CheckSQLite(t.Context()); err != nil || got != 10*time.Second {
		t.Errorf("CheckSQLite = (%v, %v), want (10s, nil)", got, err)
	}
}

func TestTxHelpersOutsideHandler(t *testing.T) {
	if inbox.Tx(context.Background()) != nil || inbox.Txx(context.Background()) != nil {
		t.Fatal("Tx/Txx outside a handler are not nil")
	}
	db := openSQLite(t, true)
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	ctx := inbox.ContextWithTx(t.Context(), tx, nil)
	if inbox.Tx(ctx) != tx || inbox.Txx(ctx) != nil {
		t.Fatal("ContextWithTx: Tx/Txx do not find the transaction")
	}
}
