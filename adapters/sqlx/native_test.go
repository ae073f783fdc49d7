package sqlxoutbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
)

// The relay's claims on a pgx pool run on pgx's connection under
// database/sql, with the transaction invisible to database/sql: every way a
// claim ends must give the connection back with no transaction open. A pool
// of one connection makes a leaked transaction swallow the next statement.
func TestNativeClaimLeavesNoTransactionPostgres(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backends[0], sqlxoutbox.Options{})
	if !sqlxoutbox.NativeClaims(e.box) {
		t.Fatal("a pgx pool does not claim on pgx's connections")
	}
	e.db.SetMaxOpenConns(1)
	ctx := context.Background()
	// pgx's stdlib discards a connection that comes back to the pool in a
	// transaction, so a leak shows as a new backend.
	pid := func() (p int) {
		t.Helper()
		if err := e.db.GetContext(ctx, &p, "SELECT pg_backend_pid()"); err != nil {
			t.Fatal(err)
		}
		return p
	}
	backend := pid()
	inTx := func(step string) {
		t.Helper()
		if p := pid(); p != backend {
			t.Fatalf("%s: the connection was replaced (backend %d, was %d): it came back in a transaction", step, p, backend)
		}
	}
	pending := func() int {
		return e.count(t, "SELECT count(*) FROM "+e.box.Queries().Table().String()+" WHERE published_at IS NULL")
	}

	if c := e.claim(t, 10); len(c.Events()) != 0 {
		t.Fatalf("claimed %d events of an empty outbox", len(c.Events()))
	}
	inTx("empty claim")
	evs := e.enqueue(t, true, events(4, "x", 1)...)
	inTx("enqueue")
	if err := e.claim(t, 1).Release(ctx); err != nil {
		t.Fatal(err)
	}
	inTx("release")

	c := e.claim(t, 10)
	if err := c.Commit(ctx, core.Outcome{Published: []int64{-1}}); !errors.Is(err, core.ErrInvalidOutcome) {
		t.Fatalf("invalid outcome: %v", err)
	}
	inTx("invalid outcome")
	if got := pending(); got != 4 {
		t.Fatalf("%d pending after an invalid outcome, want 4", got)
	}

	// One published, one failed, two not mentioned: one round trip.
	c = e.claim(t, 10)
	got := c.Events()
	if len(got) != 4 || got[0].ID != evs[0].ID {
		t.Fatalf("claimed %d events, first %v", len(got), got)
	}
	if got[0].Headers["n"] != "0" || got[0].AttemptCount != 0 || got[0].PublishedAt != nil || got[0].CreatedAt.IsZero() || string(got[0].Payload) == "" {
		t.Errorf("scanned %+v", got[0])
	}
	if err := c.Commit(ctx, core.Outcome{Published: []int64{got[0].Seq}, Failed: []core.Failure{{Seq: got[1].Seq, Err: "boom", RetryIn: time.Hour}}}); err != nil {
		t.Fatal(err)
	}
	inTx("commit")
	if got := pending(); got != 3 {
		t.Errorf("%d pending, want 3", got)
	}
	if ev := e.get(t, got[1].ID); ev.LastError != "boom" || ev.AttemptCount != 1 {
		t.Errorf("failed event %+v", ev)
	}
	if ev := e.get(t, got[2].ID); ev.AttemptCount != 0 || ev.PublishedAt != nil {
		t.Errorf("unmentioned event %+v", ev)
	}

	// A claim whose context is cancelled while it runs loses its
	// connection, not its events.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if c, err := e.box.Claim(cctx, core.ClaimRequest{Limit: 10}); err == nil {
		c.Release(ctx)
		t.Fatal("claim with a cancelled context succeeded")
	}
	// Its connection may be gone: a cancelled query closes pgx's.
	backend = pid()
	c = e.claim(t, 10)
	if n := len(c.Events()); n != 2 {
		t.Errorf("claimed %d after a cancelled claim, want the 2 due", n)
	}
	if err := c.Commit(ctx, core.Outcome{Published: seqsOf(c.Events())}); err != nil {
		t.Fatal(err)
	}
	inTx("last commit")
	if err := c.Commit(ctx, core.Outcome{}); !errors.Is(err, core.ErrClaimDone) {
		t.Errorf("second Commit: %v, want ErrClaimDone", err)
	}
}
