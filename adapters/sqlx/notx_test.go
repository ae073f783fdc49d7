package sqlxoutbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// A *sql.DB, *sqlx.DB or *sql.Conn has ExecContext and QueryContext, but an
// event written through one is outside any business transaction: the
// dual-write bug the outbox removes. Enqueue and ExecWithEvents refuse them.
func TestEnqueueRefusesNonTransactions(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		conn, err := e.db.Connx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for name, h := range map[string]sqlxoutbox.Tx{"*sqlx.DB": e.db, "*sql.DB": e.db.DB, "*sqlx.Conn": conn, "*sql.Conn": conn.Conn, "nil": nil} {
			if err := e.box.Enqueue(ctx, h, events(1, "x", 1)...); !errors.Is(err, core.ErrNoTransaction) {
				t.Errorf("Enqueue(%s) = %v, want ErrNoTransaction", name, err)
			}
			if _, err := e.box.ExecWithEvents(ctx, h, "SELECT 1", nil, events(1, "x", 1)...); !errors.Is(err, core.ErrNoTransaction) {
				t.Errorf("ExecWithEvents(%s) = %v, want ErrNoTransaction", name, err)
			}
		}
		if c := e.claim(t, 10); len(c.Events()) != 0 {
			t.Errorf("%d events written outside a transaction", len(c.Events()))
		}
	})
}

// Every Outbox of one *sql.DB and table shares the wake-up signal that its
// Capabilities report, so that a relay on one store hears the Enqueue of
// another (the producers' Outbox, the GORM plugin).
func TestWriteWakesRelaysOfTheTable(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		other, err := sqlxoutbox.NewDB(e.db.DB, sqlxoutbox.Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		sig := other.Wakeups()
		if sig == nil || sig != e.box.Wakeups() {
			t.Fatalf("two Outboxes of one table report signals %p and %p, want one", sig, e.box.Wakeups())
		}
		woken := make(chan struct{}, 10)
		defer sig.Subscribe(func() { woken <- struct{}{} })()
		e.enqueue(t, true, events(1, "x", 1)...)
		select {
		case <-woken:
		case <-time.After(wait.Stall):
			t.Fatal("Enqueue did not notify the table's signal")
		}
	})
}

// A producer's test reads what its transaction enqueued, before the commit,
// and asserts on it with outboxtest.RequireEnqueued.
func TestPendingTxForProducerTests(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		tx, err := e.db.BeginTxx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		ev, err := core.NewEvent("order", "42", "order.created", map[string]any{"order_id": 42})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.box.Enqueue(ctx, tx, ev); err != nil {
			t.Fatal(err)
		}
		evs, err := e.box.PendingTx(ctx, tx, "order.created")
		if err != nil {
			t.Fatal(err)
		}
		if got := outboxtest.RequireEnqueued(t, evs, "order.created", map[string]any{"order_id": 42}); got.ID != ev.ID {
			t.Fatalf("found %s, want %s", got.ID, ev.ID)
		}
		if _, err := e.box.PendingTx(ctx, e.db, ""); !errors.Is(err, core.ErrNoTransaction) {
			t.Fatalf("PendingTx outside a transaction: %v", err)
		}
	})
}
