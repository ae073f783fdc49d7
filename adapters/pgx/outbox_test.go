package pgxoutbox_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	pgxoutbox "github.com/txoutbox/txoutbox/adapters/pgx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

func newEnv(t *testing.T) *fixtures.PGX {
	t.Helper()
	return fixtures.NewPGX(t, fixtures.Options{Logger: quiet, SkipInbox: true}, pgxoutbox.Options{})
}

func events(n int, eventType string) []core.Event {
	evs := make([]core.Event, n)
	for i := range evs {
		evs[i] = core.Event{
			AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i), EventType: eventType,
			Payload: []byte(fmt.Sprintf(`{"n": %d}`, i)), Headers: map[string]string{"n": fmt.Sprint(i)},
		}
	}
	return evs
}

// stored reports which of evs the table holds, by ID.
func stored(t *testing.T, e *fixtures.PGX, evs []core.Event) []bool {
	t.Helper()
	out := make([]bool, len(evs))
	for i, ev := range evs {
		_, err := e.Box.Get(t.Context(), ev.ID)
		switch {
		case err == nil:
			out[i] = true
		case !errors.Is(err, core.ErrEventNotFound):
			t.Fatalf("Get(%s): %v", ev.ID, err)
		}
	}
	return out
}

// Enqueue works in every pgx transaction a service has: one from the pool,
// one from pgx.BeginFunc, one on an acquired connection, and a savepoint
// whose rollback takes its events with it while the outer transaction
// commits.
func TestEnqueueInEveryKindOfTx(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()

	fromPool := events(2, "pool")
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Order(ctx, tx, 2); err != nil {
		t.Fatal(err)
	}
	if err := e.Box.Enqueue(ctx, tx, fromPool...); err != nil {
		t.Fatal(err)
	}
	for _, ev := range fromPool {
		if ev.ID == "" || ev.Seq == 0 || ev.CreatedAt.IsZero() {
			t.Fatalf("Enqueue did not write back ID, Seq and CreatedAt: %+v", ev)
		}
	}
	if fromPool[1].Seq <= fromPool[0].Seq {
		t.Fatalf("seqs %d, %d: not in the order of the events", fromPool[0].Seq, fromPool[1].Seq)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	fromFunc := events(1, "beginfunc")
	if err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error { return e.Box.Enqueue(ctx, tx, fromFunc...) }); err != nil {
		t.Fatal(err)
	}
	rolledBack := events(1, "beginfunc-rollback")
	errAbort := errors.New("abort")
	if err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		if err := e.Box.Enqueue(ctx, tx, rolledBack...); err != nil {
			return err
		}
		return errAbort
	}); !errors.Is(err, errAbort) {
		t.Fatal(err)
	}

	conn, err := e.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	onConn := events(1, "conn")
	if err := pgx.BeginFunc(ctx, conn.Conn(), func(tx pgx.Tx) error { return e.Box.Enqueue(ctx, tx, onConn...) }); err != nil {
		t.Fatal(err)
	}
	conn.Release()

	kept, undone := events(1, "savepoint-kept"), events(1, "savepoint-undone")
	outer := events(1, "outer")
	err = pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		if err := e.Box.Enqueue(ctx, tx, outer...); err != nil {
			return err
		}
		if err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return e.Box.Enqueue(ctx, sp, kept...) }); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := e.Box.Enqueue(ctx, sp, undone...); err != nil {
			return err
		}
		return sp.Rollback(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}

	all := [][]core.Event{fromPool, fromFunc, rolledBack, onConn, outer, kept, undone}
	want := [][]bool{{true, true}, {true}, {false}, {true}, {true}, {true}, {false}}
	for i, evs := range all {
		got := stored(t, e, evs)
		if fmt.Sprint(got) != fmt.Sprint(want[i]) {
			t.Errorf("%s: stored %v, want %v", evs[0].EventType, got, want[i])
		}
	}
	if n := e.Pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired", n)
	}
}

// pgx.Tx keeps a pool or a connection out at compile time; a nil
// transaction is refused at run time.
func TestNilTxRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	if err := e.Box.Enqueue(ctx, nil, events(1, "x")...); !errors.Is(err, core.ErrNoTransaction) {
		t.Errorf("Enqueue(nil) = %v, want ErrNoTransaction", err)
	}
	if _, err := e.Box.ExecWithEvents(ctx, nil, "SELECT 1", nil, events(1, "x")...); !errors.Is(err, core.ErrNoTransaction) {
		t.Errorf("ExecWithEvents(nil) = %v, want ErrNoTransaction", err)
	}
	if _, err := e.Box.PendingTx(ctx, nil, ""); !errors.Is(err, core.ErrNoTransaction) {
		t.Errorf("PendingTx(nil) = %v, want ErrNoTransaction", err)
	}
}

// ExecWithEvents writes the caller's row and the events in one statement;
// with more events than one INSERT takes, in two; a statement that cannot
// carry them is refused before anything is written, and the transaction
// goes on.
func TestExecWithEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	one := events(3, "one-statement")
	tag, err := e.Box.ExecWithEvents(ctx, tx, "INSERT INTO orders (id, events) VALUES ($1, $2)", []any{"o-1", 3}, one...)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != 1 || !tag.Insert() {
		t.Errorf("command tag %q, want the statement's own INSERT 0 1", tag)
	}
	many := events(dialect.MaxInsertRows+1, "many")
	if _, err := e.Box.ExecWithEvents(ctx, tx, "UPDATE orders SET events = $1 WHERE id = $2", []any{len(many), "o-1"}, many...); err != nil {
		t.Fatal(err)
	}
	refused := events(1, "refused")
	if _, err := e.Box.ExecWithEvents(ctx, tx, "CREATE TABLE nope (x int)", nil, refused...); !errors.Is(err, dialect.ErrNotAttachable) {
		t.Fatalf("DDL with events = %v, want ErrNotAttachable", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after the refused statement: %v", err)
	}
	for _, evs := range [][]core.Event{one, many} {
		for i, ok := range stored(t, e, evs) {
			if !ok {
				t.Fatalf("%s event %d not stored", evs[i].EventType, i)
			}
		}
	}
	if stored(t, e, refused)[0] {
		t.Error("the refused statement's event was stored")
	}
	var n int
	if err := e.Pool.QueryRow(ctx, "SELECT events FROM orders WHERE id = 'o-1'").Scan(&n); err != nil || n != len(many) {
		t.Errorf("orders row: events = %d, %v; want %d", n, err, len(many))
	}
}

// A producer's test reads what its transaction enqueued, before the commit.
func TestPendingTx(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	evs := append(events(2, "order.created"), events(1, "other")...)
	if err := e.Box.Enqueue(ctx, tx, evs...); err != nil {
		t.Fatal(err)
	}
	got, err := e.Box.PendingTx(ctx, tx, "order.created")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != evs[0].ID || got[1].ID != evs[1].ID || got[1].Headers["n"] != "1" {
		t.Fatalf("PendingTx = %+v", got)
	}
}

// The operators' tools on the pool: dead letters listed, retried and
// purged, published events replayed, counted and cleaned up; stats.
func TestOperatorTools(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	evs := events(3, "ops")
	if err := e.StoreFixture().Enqueue(ctx, evs, true); err != nil {
		t.Fatal(err)
	}
	c, err := e.Box.Claim(ctx, core.ClaimRequest{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	got := c.Events()
	if len(got) != 3 {
		t.Fatalf("claimed %d events, want 3", len(got))
	}
	if err := c.Commit(ctx, core.Outcome{
		Published: []int64{got[0].Seq},
		Failed:    []core.Failure{{Seq: got[1].Seq, Err: "boom", Dead: true}, {Seq: got[2].Seq, Err: "later", RetryIn: time.Hour}},
	}); err != nil {
		t.Fatal(err)
	}
	dead, err := e.Box.ListDead(ctx, pgxoutbox.DeadFilter{}, pgxoutbox.Page{})
	if err != nil || len(dead) != 1 || dead[0].ID != evs[1].ID || dead[0].LastError != "boom" {
		t.Fatalf("ListDead = %+v, %v", dead, err)
	}
	st, err := e.Box.Stats(ctx)
	if err != nil || st.Pending != 1 || st.Dead != 1 {
		t.Fatalf("Stats = %+v, %v; want 1 pending, 1 dead", st, err)
	}
	if n, err := e.Box.RetryDead(ctx, pgxoutbox.DeadFilter{All: true}); err != nil || n != 1 {
		t.Fatalf("RetryDead = %d, %v", n, err)
	}
	if ev, err := e.Box.GetBySeq(ctx, got[1].Seq); err != nil || ev.DeadAt != nil || ev.AttemptCount != 0 {
		t.Fatalf("retried event: %+v, %v", ev, err)
	}
	if n, err := e.Box.Replay(ctx, pgxoutbox.ReplayFilter{FromSeq: got[0].Seq, ToSeq: got[0].Seq}); err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	// Publish everything, then count and clean up.
	c, err = e.Box.Claim(ctx, core.ClaimRequest{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, ev := range c.Events() {
		seqs = append(seqs, ev.Seq)
	}
	if len(seqs) != 2 { // the retried and the replayed; the third waits an hour
		t.Fatalf("claimed %d events after retry and replay, want 2", len(seqs))
	}
	if err := c.Commit(ctx, core.Outcome{Published: seqs}); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if n, err := e.Box.CountPublishedBefore(ctx, later); err != nil || n != 2 {
		t.Fatalf("CountPublishedBefore = %d, %v", n, err)
	}
	if n, err := e.Box.DeletePublished(ctx, later, 1); err != nil || n != 1 {
		t.Fatalf("DeletePublished(limit 1) = %d, %v", n, err)
	}
	if n, err := e.Box.PurgeDead(ctx, pgxoutbox.DeadFilter{All: true}); err != nil || n != 0 {
		t.Fatalf("PurgeDead = %d, %v", n, err)
	}
	if n := e.Pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired", n)
	}
}

// Without its table, the Outbox says so in its own name, and every path
// wraps core.ErrNotMigrated.
func TestMissingTable(t *testing.T) {
	t.Parallel()
	pool := testenv.OpenPgxPool(t, testenv.PostgresDSN(t))
	box, err := pgxoutbox.New(pool, pgxoutbox.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	err = box.Ping(ctx)
	if !errors.Is(err, core.ErrNotMigrated) || !strings.HasPrefix(err.Error(), "pgxoutbox: ") {
		t.Errorf("Ping = %v, want ErrNotMigrated named pgxoutbox", err)
	}
	if _, err := box.Claim(ctx, core.ClaimRequest{Limit: 1}); !errors.Is(err, core.ErrNotMigrated) {
		t.Errorf("Claim = %v, want ErrNotMigrated", err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return box.Enqueue(ctx, tx, events(1, "x")...) })
	if !errors.Is(err, core.ErrNotMigrated) {
		t.Errorf("Enqueue = %v, want ErrNotMigrated", err)
	}
	if err := pgxoutbox.Migrate(ctx, pool, dialect.MigrateOptions{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if err := box.Ping(ctx); err != nil {
		t.Errorf("Ping after Migrate = %v", err)
	}
}

// Every Outbox of one pool and table shares the wake-up signal, so that a
// relay on one hears the Enqueue of another; Enqueue and ExecWithEvents
// ring it.
func TestWritesWakeRelaysOfThePool(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	other, err := pgxoutbox.New(e.Pool, pgxoutbox.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	sig := other.Wakeups()
	if sig == nil || sig != e.Box.Wakeups() {
		t.Fatalf("two Outboxes of one pool report signals %p and %p, want one", sig, e.Box.Wakeups())
	}
	woken := make(chan struct{}, 10)
	defer sig.Subscribe(func() { woken <- struct{}{} })()
	err = pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		if err := e.Box.Enqueue(ctx, tx, events(1, "x")...); err != nil {
			return err
		}
		_, err := e.Box.ExecWithEvents(ctx, tx, "SELECT 1", nil, events(1, "y")...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		select {
		case <-woken:
		case <-time.After(wait.Stall):
			t.Fatalf("wake-up %d of 2 missing", i+1)
		}
	}
}

// With SkipReadBack, Enqueue writes the rows and writes back the IDs only.
func TestEnqueueSkipReadBack(t *testing.T) {
	t.Parallel()
	e := fixtures.NewPGX(t, fixtures.Options{Logger: quiet, SkipInbox: true}, pgxoutbox.Options{SkipReadBack: true})
	ctx := t.Context()
	evs := events(dialect.MaxInsertRows+3, "plain")
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Box.Enqueue(ctx, tx, evs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for i, ev := range evs {
		if ev.ID == "" || ev.Seq != 0 || !ev.CreatedAt.IsZero() {
			t.Fatalf("event %d: ID %q, Seq %d, CreatedAt %v; want an ID and nothing read back", i, ev.ID, ev.Seq, ev.CreatedAt)
		}
	}
	for i, ok := range stored(t, e, evs) {
		if !ok {
			t.Fatalf("event %d (%s) not stored", i, evs[i].ID)
		}
	}
}
