package sqlxoutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

func TestEnqueueCommitAndRollback(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		committed := e.enqueue(t, true, events(1, "order.created", 1)...)
		rolledBack := e.enqueue(t, false, events(1, "order.created", 1)...)

		got := e.get(t, committed[0].ID)
		if got.Seq == 0 || got.Seq != committed[0].Seq || got.CreatedAt.IsZero() || !got.CreatedAt.Equal(committed[0].CreatedAt) {
			t.Errorf("stored %+v, enqueued %+v", got, committed[0])
		}
		if got.PublishedAt != nil || got.DeadAt != nil || got.AttemptCount != 0 || got.LastError != "" {
			t.Errorf("fresh event has bookkeeping: %+v", got)
		}
		if got.EventType != "order.created" || got.AggregateID != "o-0" || got.Headers["n"] != "0" || !strings.Contains(string(got.Payload), `"n"`) {
			t.Errorf("stored fields differ: %+v", got)
		}
		if _, err := e.box.Get(ctx, rolledBack[0].ID); !errors.Is(err, core.ErrEventNotFound) {
			t.Errorf("rolled-back event: Get = %v, want ErrNotFound", err)
		}
		c := e.claim(t, 10)
		if evs := c.Events(); len(evs) != 1 || evs[0].ID != committed[0].ID {
			t.Errorf("claimed %v, want only the committed event", evs)
		}
		if err := c.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var orders int
		if err := e.db.GetContext(ctx, &orders, "SELECT count(*) FROM orders"); err != nil || orders != 1 {
			t.Errorf("orders = %d, %v; want 1", orders, err)
		}
	})
}

// An event enqueued but not yet committed is invisible to claims. (On SQLite
// the open producer transaction holds the only write lock, so the claim
// would wait for it instead.)
func TestUncommittedInvisiblePostgres(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backends[0], sqlxoutbox.Options{})
	ctx := context.Background()
	tx, err := e.db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := e.box.Enqueue(ctx, tx, events(3, "x", 1)...); err != nil {
		t.Fatal(err)
	}
	c := e.claim(t, 10)
	if n := len(c.Events()); n != 0 {
		t.Errorf("claimed %d uncommitted events", n)
	}
	if err := c.Release(ctx); err != nil {
		t.Error(err)
	}
}

func TestEnqueueBatch(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		const n = 2*dialect.MaxInsertRows + 37 // three INSERT statements
		evs := e.enqueue(t, true, events(n, "bulk", 7)...)
		for i := range evs {
			if evs[i].ID == "" || evs[i].Seq == 0 || evs[i].CreatedAt.IsZero() {
				t.Fatalf("event %d not filled back: %+v", i, evs[i])
			}
			if i > 0 && evs[i].Seq <= evs[i-1].Seq {
				t.Fatalf("seqs not increasing in enqueue order at %d: %d after %d", i, evs[i].Seq, evs[i-1].Seq)
			}
		}
		// The seq written back is the row of that very event.
		for _, i := range []int{0, 999, 1000, n - 1} {
			if got := e.get(t, evs[i].ID); got.Seq != evs[i].Seq || got.Headers["n"] != evs[i].Headers["n"] {
				t.Errorf("event %d: stored seq %d headers %v, enqueued seq %d", i, got.Seq, got.Headers, evs[i].Seq)
			}
		}
		c := e.claim(t, 500)
		if got := seqsOf(c.Events()); !slices.Equal(got, seqsOf(evs[:500])) {
			t.Errorf("claim order differs from enqueue order")
		}
		c.Release(ctx)
		s, err := e.box.Stats(ctx)
		if err != nil || s.Pending != n || s.ByType["bulk"].Pending != n {
			t.Errorf("Stats = %+v, %v; want %d pending", s, err, n)
		}
	})
}

func TestEnqueueValidationHooksNotify(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			var notified atomic.Int64
			hook := func(_ context.Context, ev *core.Event) error {
				if ev.Headers == nil {
					ev.Headers = map[string]string{}
				}
				ev.Headers["hooked"] = ev.ID
				return nil
			}
			e := newEnv(t, b, sqlxoutbox.Options{
				Notifier: core.NotifierFunc(func() { notified.Add(1) }),
				Hooks:    []core.EnqueueHook{hook},
			})
			ctx := context.Background()
			tx, err := e.db.BeginTxx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if err := e.box.Enqueue(ctx, tx, core.Event{Payload: []byte(`{}`)}); !errors.Is(err, core.ErrInvalidEvent) {
				t.Errorf("no event type: %v, want ErrInvalidEvent", err)
			}
			if err := e.box.Enqueue(ctx, tx, core.Event{EventType: "x", Payload: []byte(`{not json`)}); !errors.Is(err, core.ErrInvalidEvent) {
				t.Errorf("bad JSON: %v, want ErrInvalidEvent", err)
			}
			if notified.Load() != 0 {
				t.Errorf("notified for failed Enqueue")
			}
			evs := events(2, "x", 1)
			if err := e.box.Enqueue(ctx, tx, evs...); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if notified.Load() != 1 {
				t.Errorf("notified %d times, want 1", notified.Load())
			}
			if got := e.get(t, evs[1].ID); got.Headers["hooked"] != evs[1].ID {
				t.Errorf("hook's header not stored: %v", got.Headers)
			}
		})
	}
}

func TestClaimCommitRelease(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		evs := e.enqueue(t, true, events(5, "x", 1)...)
		c := e.claim(t, 3)
		if got := seqsOf(c.Events()); !slices.Equal(got, seqsOf(evs[:3])) {
			t.Fatalf("claimed %v, want %v", got, seqsOf(evs[:3]))
		}
		if err := c.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Release(ctx); !errors.Is(err, core.ErrClaimDone) {
			t.Errorf("second Release = %v, want ErrClaimDone", err)
		}
		if err := c.Commit(ctx, core.Outcome{}); !errors.Is(err, core.ErrClaimDone) {
			t.Errorf("Commit after Release = %v, want ErrClaimDone", err)
		}

		// Released events come back, untouched and in order.
		c = e.claim(t, 3)
		if got := seqsOf(c.Events()); !slices.Equal(got, seqsOf(evs[:3])) {
			t.Fatalf("after release claimed %v, want %v", got, seqsOf(evs[:3]))
		}
		out := core.Outcome{
			Published: []int64{evs[0].Seq},
			Failed:    []core.Failure{{Seq: evs[1].Seq, Err: "broker said no", RetryIn: time.Hour}},
		} // evs[2] unmentioned: released unchanged
		if err := c.Commit(ctx, out); err != nil {
			t.Fatal(err)
		}
		if err := c.Commit(ctx, out); !errors.Is(err, core.ErrClaimDone) {
			t.Errorf("second Commit = %v, want ErrClaimDone", err)
		}
		if got := e.get(t, evs[0].ID); got.PublishedAt == nil || got.AttemptCount != 1 {
			t.Errorf("published event: %+v", got)
		}
		if got := e.get(t, evs[2].ID); got.PublishedAt != nil || got.AttemptCount != 0 {
			t.Errorf("unmentioned event changed: %+v", got)
		}
		c = e.claim(t, 10)
		if got := seqsOf(c.Events()); !slices.Equal(got, seqsOf(evs[2:])) {
			t.Errorf("next claim %v, want %v (published and backed-off excluded)", got, seqsOf(evs[2:]))
		}

		// A bad outcome is refused and the claim released.
		bad := core.Outcome{Published: []int64{evs[2].Seq, evs[0].Seq}}
		if err := c.Commit(ctx, bad); !errors.Is(err, core.ErrInvalidOutcome) {
			t.Errorf("Commit(seq not claimed) = %v, want ErrInvalidOutcome", err)
		}
		c = e.claim(t, 10)
		if got := seqsOf(c.Events()); !slices.Equal(got, seqsOf(evs[2:])) {
			t.Errorf("after refused commit claimed %v, want %v", got, seqsOf(evs[2:]))
		}
		dup := core.Outcome{Published: []int64{evs[2].Seq}, Failed: []core.Failure{{Seq: evs[2].Seq}}}
		if err := c.Commit(ctx, dup); !errors.Is(err, core.ErrInvalidOutcome) {
			t.Errorf("Commit(seq twice) = %v, want ErrInvalidOutcome", err)
		}

		if _, err := e.box.Claim(ctx, core.ClaimRequest{}); !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("Claim(limit 0) = %v", err)
		}
	})
}

func TestEmptyClaim(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		for _, finish := range []func(core.Claim) error{
			func(c core.Claim) error { return c.Release(ctx) },
			func(c core.Claim) error { return c.Commit(ctx, core.Outcome{}) },
		} {
			c := e.claim(t, 10)
			if len(c.Events()) != 0 {
				t.Fatalf("claimed %d events from an empty table", len(c.Events()))
			}
			if err := finish(c); err != nil {
				t.Errorf("finishing an empty claim: %v", err)
			}
			if err := c.Release(ctx); !errors.Is(err, core.ErrClaimDone) {
				t.Errorf("Release after finish = %v, want ErrClaimDone", err)
			}
		}
	})
}

// The relay finishes a batch after its context is cancelled (shutdown), so
// a claim must outlive the context it was made with.
func TestClaimOutlivesItsContext(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		evs := e.enqueue(t, true, events(2, "x", 1)...)
		ctx, cancel := context.WithCancel(context.Background())
		c, err := e.box.Claim(ctx, core.ClaimRequest{Limit: 10})
		if err != nil || len(c.Events()) != 2 {
			t.Fatalf("Claim = %v, %v", c, err)
		}
		cancel()
		time.Sleep(20 * time.Millisecond) // database/sql would roll back here
		if err := c.Commit(context.Background(), core.Outcome{Published: seqsOf(evs)}); err != nil {
			t.Fatalf("Commit after the claim's context ended: %v", err)
		}
		if got := e.get(t, evs[1].ID); got.PublishedAt == nil {
			t.Errorf("not marked published: %+v", got)
		}
	})
}

// A claim whose relay died (PostgreSQL: connection gone) frees its events.
func TestAbandonedClaimPostgres(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backends[0], sqlxoutbox.Options{})
	ctx := context.Background()
	evs := e.enqueue(t, true, events(4, "x", 1)...)
	dead := e.claim(t, 10)
	if len(dead.Events()) != 4 {
		t.Fatalf("claimed %d", len(dead.Events()))
	}
	if n := len(e.claim(t, 10).Events()); n != 0 {
		t.Fatalf("events of an open claim claimed again: %d", n)
	}
	var killed int
	if err := e.db.GetContext(ctx, &killed, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"+
		" WHERE datname = current_database() AND state = 'idle in transaction'"); err != nil || killed != 1 {
		t.Fatalf("terminated %d backends, %v; want the claim's one", killed, err)
	}
	// pg_terminate_backend only signals: the locks go a moment later.
	var c core.Claim
	wait.Until(t, "the crashed claim's events to be claimable", func() bool {
		c = e.claim(t, 10)
		if len(c.Events()) > 0 {
			return true
		}
		c.Release(ctx)
		return false
	})
	if got := seqsOf(c.Events()); !slices.Equal(got, seqsOf(evs)) {
		t.Errorf("after the crash claimed %v, want %v", got, seqsOf(evs))
	}
	if err := dead.Commit(ctx, core.Outcome{Published: seqsOf(evs)}); err == nil {
		t.Errorf("Commit of the dead claim succeeded")
	}
	if err := c.Commit(ctx, core.Outcome{Published: seqsOf(evs)}); err != nil {
		t.Fatal(err)
	}
}

// A claim whose relay died (SQLite: no release) frees its events when its
// lease expires, and not before.
func TestAbandonedClaimSQLite(t *testing.T) {
	t.Parallel()
	const lease = 400 * time.Millisecond
	e := newEnv(t, backends[1], sqlxoutbox.Options{ClaimLease: lease})
	evs := e.enqueue(t, true, events(4, "x", 1)...)
	start := time.Now()
	if n := len(e.claim(t, 10).Events()); n != 4 {
		t.Fatalf("claimed %d", n)
	}
	if n := len(e.claim(t, 10).Events()); n != 0 && time.Since(start) < lease {
		t.Fatalf("events of a live lease claimed again: %d", n)
	}
	time.Sleep(lease + 50*time.Millisecond)
	c := e.claim(t, 10)
	if got := seqsOf(c.Events()); !slices.Equal(got, seqsOf(evs)) {
		t.Errorf("after the lease claimed %v, want %v", got, seqsOf(evs))
	}
	if err := c.Commit(context.Background(), core.Outcome{Published: seqsOf(evs)}); err != nil {
		t.Fatal(err)
	}
}

// Two open claims never share an event; on PostgreSQL by SKIP LOCKED, on
// SQLite by the lease.
func TestOpenClaimsDisjoint(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		evs := e.enqueue(t, true, events(10, "x", 1)...)
		a, b := e.claim(t, 4), e.claim(t, 100)
		if !slices.Equal(seqsOf(a.Events()), seqsOf(evs[:4])) || !slices.Equal(seqsOf(b.Events()), seqsOf(evs[4:])) {
			t.Errorf("claims %v and %v overlap or miss events", seqsOf(a.Events()), seqsOf(b.Events()))
		}
		if n := len(e.claim(t, 100).Events()); n != 0 {
			t.Errorf("third claim got %d events", n)
		}
		a.Release(ctx)
		b.Release(ctx)
	})
}

// Many relays draining one PostgreSQL table at once publish every event
// exactly once (no crash, so no duplicate).
func TestConcurrentClaimsPostgres(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backends[0], sqlxoutbox.Options{})
	ctx := context.Background()
	const n, workers = 3000, 6
	for range 3 {
		e.enqueue(t, true, events(n/3, "x", 50)...)
	}
	var mu sync.Mutex
	seen := map[int64]int{}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				c, err := e.box.Claim(ctx, core.ClaimRequest{Limit: 37})
				if err != nil {
					t.Error(err)
					return
				}
				evs := c.Events()
				if len(evs) == 0 {
					c.Release(ctx)
					return
				}
				mu.Lock()
				for _, ev := range evs {
					seen[ev.Seq]++
				}
				mu.Unlock()
				time.Sleep(time.Millisecond) // hold the locks while others claim
				if err := c.Commit(ctx, core.Outcome{Published: seqsOf(evs)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if len(seen) != n {
		t.Errorf("%d distinct events claimed, want %d", len(seen), n)
	}
	for seq, k := range seen {
		if k != 1 {
			t.Errorf("event %d claimed %d times", seq, k)
		}
	}
}

func TestFailuresAndDeadLetters(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		evs := e.enqueue(t, true, events(3, "x", 1)...)
		c := e.claim(t, 10)
		before := time.Now()
		long := strings.Repeat("é", 100) + "\x00 nul"
		if err := c.Commit(ctx, core.Outcome{Failed: []core.Failure{
			{Seq: evs[0].Seq, Err: "timeout", RetryIn: time.Hour},
			{Seq: evs[1].Seq, Err: long, RetryIn: 0},
			{Seq: evs[2].Seq, Err: "poison", RetryIn: time.Hour, Dead: true},
		}}); err != nil {
			t.Fatal(err)
		}
		f0 := e.get(t, evs[0].ID)
		if f0.AttemptCount != 1 || f0.LastError != "timeout" || f0.DeadAt != nil || f0.PublishedAt != nil {
			t.Errorf("failed event: %+v", f0)
		}
		if d := f0.NextAttemptAt.Sub(before); d < 59*time.Minute || d > 61*time.Minute {
			t.Errorf("next attempt in %v, want ~1h", d)
		}
		if f1 := e.get(t, evs[1].ID); f1.LastError != strings.ReplaceAll(long, "\x00", "") {
			t.Errorf("last_error = %q", f1.LastError)
		}
		f2 := e.get(t, evs[2].ID)
		if f2.DeadAt == nil || f2.AttemptCount != 1 || f2.LastError != "poison" {
			t.Errorf("dead event: %+v", f2)
		}
		// Only the event due again (RetryIn 0) is claimable.
		c = e.claim(t, 10)
		if got := seqsOf(c.Events()); !slices.Equal(got, []int64{evs[1].Seq}) {
			t.Errorf("claimed %v, want only %d", got, evs[1].Seq)
		}
		if ev := c.Events()[0]; ev.AttemptCount != 1 {
			t.Errorf("claimed event carries attempts %d, want 1", ev.AttemptCount)
		}
		if err := c.Commit(ctx, core.Outcome{Failed: []core.Failure{{Seq: evs[1].Seq, Err: "again", Dead: true}}}); err != nil {
			t.Fatal(err)
		}
		if f1 := e.get(t, evs[1].ID); f1.AttemptCount != 2 || f1.DeadAt == nil {
			t.Errorf("twice failed event: %+v", f1)
		}
		s, err := e.box.Stats(ctx)
		if err != nil || s.Dead != 2 || s.Pending != 1 {
			t.Errorf("Stats = %+v, %v; want 2 dead, 1 pending", s, err)
		}
	})
}

func TestStats(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		s, err := e.box.Stats(ctx)
		if err != nil || s.Pending != 0 || s.Dead != 0 || !s.OldestPending.IsZero() || s.OldestPendingAge != 0 {
			t.Errorf("empty Stats = %+v, %v", s, err)
		}
		a := e.enqueue(t, true, events(3, "a", 1)...)
		b := e.enqueue(t, true, events(2, "b", 1)...)
		if err := e.backdate(ctx, a[0].ID, 2*time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := e.backdate(ctx, b[0].ID, 10*time.Minute); err != nil {
			t.Fatal(err)
		}
		c := e.claim(t, 100)
		// b[0] goes dead, a[1] is published; the rest stays pending.
		if err := c.Commit(ctx, core.Outcome{Published: []int64{a[1].Seq}, Failed: []core.Failure{{Seq: b[0].Seq, Err: "x", Dead: true}}}); err != nil {
			t.Fatal(err)
		}
		s, err = e.box.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.Pending != 3 || s.Dead != 1 {
			t.Errorf("Stats = %+v; want 3 pending, 1 dead", s)
		}
		if s.OldestPendingAge < 2*time.Hour || s.OldestPendingAge > 2*time.Hour+time.Minute {
			t.Errorf("OldestPendingAge = %v, want ~2h", s.OldestPendingAge)
		}
		if age := time.Since(s.OldestPending); age < 2*time.Hour-time.Minute || age > 2*time.Hour+time.Minute {
			t.Errorf("OldestPending %v is %v ago, want ~2h", s.OldestPending, age)
		}
		ta, tb := s.ByType["a"], s.ByType["b"]
		if ta.Pending != 2 || ta.Dead != 0 || ta.OldestPendingAge < 2*time.Hour {
			t.Errorf("ByType[a] = %+v", ta)
		}
		// b's oldest went dead: its pending age is the young b[1]'s.
		if tb.Pending != 1 || tb.Dead != 1 || tb.OldestPendingAge > time.Minute {
			t.Errorf("ByType[b] = %+v", tb)
		}
	})
}

func TestCleanupBoundedBatches(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		old := e.enqueue(t, true, events(25, "old", 3)...)
		recent := e.enqueue(t, true, events(4, "recent", 1)...)
		pending := e.enqueue(t, true, events(3, "pending", 1)...)
		dead := e.enqueue(t, true, events(2, "dead", 1)...)
		c := e.claim(t, 1000)
		if err := c.Commit(ctx, core.Outcome{
			Published: append(seqsOf(old), seqsOf(recent)...),
			Failed:    []core.Failure{{Seq: dead[0].Seq, Err: "x", Dead: true}, {Seq: dead[1].Seq, Err: "x", Dead: true}},
		}); err != nil {
			t.Fatal(err)
		}
		for _, ev := range append(append(append([]core.Event{}, old...), pending...), dead...) {
			if err := e.backdate(ctx, ev.ID, 48*time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := e.box.DeletePublished(ctx, time.Now().Add(-24*time.Hour), 10); err != nil || n != 10 {
			t.Fatalf("DeletePublished(limit 10) = %d, %v; want 10", n, err)
		}
		var progress []int64
		n, err := core.Cleanup(ctx, e.box, core.CleanupOptions{Retention: 24 * time.Hour, BatchSize: 10, OnProgress: func(d int64) { progress = append(progress, d) }})
		if err != nil || n != 15 {
			t.Fatalf("Cleanup = %d, %v; want 15", n, err)
		}
		if !slices.Equal(progress, []int64{10, 15}) {
			t.Errorf("progress %v, want [10 15] (bounded batches)", progress)
		}
		for _, ev := range old {
			if _, err := e.box.Get(ctx, ev.ID); !errors.Is(err, core.ErrEventNotFound) {
				t.Errorf("old published event %d survived: %v", ev.Seq, err)
			}
		}
		for _, ev := range append(append(append([]core.Event{}, recent...), pending...), dead...) {
			e.get(t, ev.ID) // fails if deleted
		}
	})
}

func TestDeadLetterRetryAndPurge(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		a := e.enqueue(t, true, events(3, "a", 1)...)
		b := e.enqueue(t, true, events(3, "b", 1)...)
		all := append(append([]core.Event{}, a...), b...)
		c := e.claim(t, 100)
		var fs []core.Failure
		for _, ev := range all {
			fs = append(fs, core.Failure{Seq: ev.Seq, Err: "boom " + ev.EventType, Dead: true})
		}
		if err := c.Commit(ctx, core.Outcome{Failed: fs}); err != nil {
			t.Fatal(err)
		}

		// Paging through the dead letters.
		p1, err := e.box.ListDead(ctx, sqlxoutbox.DeadFilter{}, sqlxoutbox.Page{Limit: 4})
		if err != nil || len(p1) != 4 {
			t.Fatalf("ListDead page 1 = %d, %v", len(p1), err)
		}
		p2, err := e.box.ListDead(ctx, sqlxoutbox.DeadFilter{}, sqlxoutbox.Page{AfterSeq: p1[3].Seq, Limit: 4})
		if err != nil || len(p2) != 2 {
			t.Fatalf("ListDead page 2 = %d, %v", len(p2), err)
		}
		if got := append(seqsOf(p1), seqsOf(p2)...); !slices.Equal(got, seqsOf(all)) {
			t.Errorf("listed %v, want %v", got, seqsOf(all))
		}
		if p1[0].LastError != "boom a" || p1[0].DeadAt == nil || p1[0].AttemptCount != 1 {
			t.Errorf("dead event listed as %+v", p1[0])
		}
		onlyB, err := e.box.ListDead(ctx, sqlxoutbox.DeadFilter{EventType: "b"}, sqlxoutbox.Page{})
		if err != nil || !slices.Equal(seqsOf(onlyB), seqsOf(b)) {
			t.Errorf("ListDead(type b) = %v, %v", seqsOf(onlyB), err)
		}

		if _, err := e.box.RetryDead(ctx, sqlxoutbox.DeadFilter{}); !errors.Is(err, dialect.ErrInvalidFilter) {
			t.Errorf("RetryDead(empty) = %v, want ErrInvalidFilter", err)
		}
		if _, err := e.box.PurgeDead(ctx, sqlxoutbox.DeadFilter{}); !errors.Is(err, dialect.ErrInvalidFilter) {
			t.Errorf("PurgeDead(empty) = %v, want ErrInvalidFilter", err)
		}
		// By type, by seq, by event ID.
		if n, err := e.box.RetryDead(ctx, sqlxoutbox.DeadFilter{EventType: "a"}); err != nil || n != 3 {
			t.Errorf("RetryDead(type a) = %d, %v", n, err)
		}
		if n, err := e.box.RetryDead(ctx, sqlxoutbox.DeadFilter{Seqs: []int64{b[0].Seq}}); err != nil || n != 1 {
			t.Errorf("RetryDead(seq) = %d, %v", n, err)
		}
		if n, err := e.box.RetryDead(ctx, sqlxoutbox.DeadFilter{EventIDs: []string{b[1].ID, a[0].ID}}); err != nil || n != 1 {
			t.Errorf("RetryDead(ids, one of them not dead) = %d, %v; want 1", n, err)
		}
		got := e.get(t, a[0].ID)
		if got.DeadAt != nil || got.AttemptCount != 0 || got.LastError != "boom a" {
			t.Errorf("re-queued event: %+v", got)
		}
		c = e.claim(t, 100)
		if want := append(seqsOf(a), b[0].Seq, b[1].Seq); !slices.Equal(seqsOf(c.Events()), want) {
			t.Errorf("claimed after retry %v, want %v", seqsOf(c.Events()), want)
		}
		c.Release(ctx)
		s, _ := e.box.Stats(ctx)
		if s.Dead != 1 || s.Pending != 5 {
			t.Errorf("Stats after retry = %+v", s)
		}
		if n, err := e.box.PurgeDead(ctx, sqlxoutbox.DeadFilter{All: true}); err != nil || n != 1 {
			t.Errorf("PurgeDead(All) = %d, %v", n, err)
		}
		if _, err := e.box.Get(ctx, b[2].ID); !errors.Is(err, core.ErrEventNotFound) {
			t.Errorf("purged event still there: %v", err)
		}
		if n, err := e.box.RetryDead(ctx, sqlxoutbox.DeadFilter{All: true}); err != nil || n != 0 {
			t.Errorf("RetryDead(All) on no dead = %d, %v", n, err)
		}
	})
}

// On MariaDB an operator's retry or purge by Seq, the archiver's delete
// and the relay's outcome statements find their rows by primary key: with
// IN (SELECT … FROM JSON_TABLE), or a plain IN list without the index
// hint, they read the whole outbox, locking each row read, other relays'
// claimed rows among them.
func TestMySQLBySeqStatementsUseThePrimaryKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backends[slices.IndexFunc(backends, func(b backend) bool { return b.d == dialect.MySQL })], sqlxoutbox.Options{})
	ctx := context.Background()
	evs := e.enqueue(t, true, events(60, "e", 6)...)
	var fs []core.Failure
	for _, ev := range evs[:20] {
		fs = append(fs, core.Failure{Seq: ev.Seq, Err: "boom", Dead: true})
	}
	if err := e.claim(t, 40).Commit(ctx, core.Outcome{Failed: fs, Published: seqsOf(evs[20:40])}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(ctx, "ANALYZE TABLE outbox_events"); err != nil {
		t.Fatal(err)
	}
	q, err := dialect.MySQL.Queries("")
	if err != nil {
		t.Fatal(err)
	}
	two := dialect.DeadFilter{Seqs: seqsOf(evs[3:5])}
	retry, retryArgs, err := q.RetryDead(two)
	if err != nil {
		t.Fatal(err)
	}
	purge, purgeArgs, err := q.PurgeDead(two)
	if err != nil {
		t.Fatal(err)
	}
	del, delArgs := q.DeleteArchived(seqsOf(evs[25:27]), time.Now().Add(time.Hour))
	for name, s := range map[string]struct {
		query string
		args  []any
	}{"RetryDead": {retry, retryArgs}, "PurgeDead": {purge, purgeArgs}, "DeleteArchived": {del, delArgs}} {
		requirePrimaryKeyRead(t, e.db.DB, name, s.query, s.args)
	}
	requireOutcomesByPrimaryKey(t, e.db.DB, q, seqsOf(evs[45:48]))
}

// The relay's outcome statements on a new table, whose statistics say it
// is empty: MariaDB reads a plain IN list's table whole then, unless told
// to use the primary key.
func TestMySQLOutcomesUseThePrimaryKeyOnANewTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backends[slices.IndexFunc(backends, func(b backend) bool { return b.d == dialect.MySQL })], sqlxoutbox.Options{})
	if _, err := e.db.ExecContext(t.Context(), "ANALYZE TABLE outbox_events"); err != nil {
		t.Fatal(err)
	}
	q, err := dialect.MySQL.Queries("")
	if err != nil {
		t.Fatal(err)
	}
	requireOutcomesByPrimaryKey(t, e.db.DB, q, []int64{1, 2, 3})
}

// requireOutcomesByPrimaryKey checks the relay's outcome statements for
// seqs with requirePrimaryKeyRead.
func requireOutcomesByPrimaryKey(t *testing.T, db *sql.DB, q *dialect.Queries, seqs []int64) {
	t.Helper()
	mark, markArgs := q.MarkPublished(seqs)
	requirePrimaryKeyRead(t, db, "MarkPublished", mark, markArgs)
	clear, clearArgs := q.ClearLastError(seqs)
	requirePrimaryKeyRead(t, db, "ClearLastError", clear, clearArgs)
	deleteNow, deleteNowArgs := q.DeletePublishedNow(seqs, false)
	requirePrimaryKeyRead(t, db, "DeletePublishedNow", deleteNow, deleteNowArgs)
	failed, failedArgs, err := q.MarkFailed([]core.Failure{{Seq: seqs[0], Err: "boom"}})
	if err != nil {
		t.Fatal(err)
	}
	requirePrimaryKeyRead(t, db, "MarkFailed", failed, failedArgs)
}

// requirePrimaryKeyRead fails t unless EXPLAIN shows query reading the
// outbox by its primary key, not whole.
func requirePrimaryKeyRead(t *testing.T, db *sql.DB, name, query string, args []any) {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), "EXPLAIN "+query, args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", name, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	found := false
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		if row["table"] != "outbox_events" && row["table"] != "o" {
			continue
		}
		found = true
		if row["key"] != "PRIMARY" || row["type"] == "ALL" || row["type"] == "index" {
			t.Errorf("%s reads the outbox by %q (%s, %s rows): %s", name, row["key"], row["type"], row["rows"], query)
		}
	}
	if !found {
		t.Errorf("%s: EXPLAIN shows no read of the outbox", name)
	}
}

func TestReplay(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		evs := e.enqueue(t, true, events(8, "a", 2)...) // aggregates o-0, o-1 alternate
		evs = append(evs, e.enqueue(t, true, events(2, "b", 1)...)...)
		pending := e.enqueue(t, true, events(1, "a", 1)...)
		c := e.claim(t, 10)
		if err := c.Commit(ctx, core.Outcome{Published: seqsOf(evs)}); err != nil {
			t.Fatal(err)
		}
		if err := e.backdate(ctx, evs[0].ID, 72*time.Hour); err != nil {
			t.Fatal(err)
		}
		replayed := func(f sqlxoutbox.ReplayFilter, want ...core.Event) {
			t.Helper()
			n, err := e.box.Replay(ctx, f)
			if err != nil || n != int64(len(want)) {
				t.Fatalf("Replay(%+v) = %d, %v; want %d", f, n, err, len(want))
			}
			c := e.claim(t, 100)
			wantSeqs := append(seqsOf(pending), seqsOf(want)...)
			if got := seqsOf(c.Events()); !slices.Equal(got, wantSeqs) {
				t.Fatalf("after Replay(%+v) claimed %v, want %v", f, got, wantSeqs)
			}
			for _, ev := range c.Events()[1:] {
				if ev.PublishedAt != nil || ev.AttemptCount != 0 {
					t.Errorf("replayed event bookkeeping: %+v", ev)
				}
			}
			// Publish them again, leaving the pending one alone.
			if err := c.Commit(ctx, core.Outcome{Published: seqsOf(want)}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := e.box.Replay(ctx, sqlxoutbox.ReplayFilter{}); !errors.Is(err, dialect.ErrInvalidFilter) {
			t.Errorf("Replay(empty) = %v", err)
		}
		replayed(sqlxoutbox.ReplayFilter{FromSeq: evs[2].Seq, ToSeq: evs[4].Seq}, evs[2:5]...)
		replayed(sqlxoutbox.ReplayFilter{AggregateID: "o-1", EventType: "a"}, evs[1], evs[3], evs[5], evs[7])
		replayed(sqlxoutbox.ReplayFilter{EventType: "b"}, evs[8:]...)
		replayed(sqlxoutbox.ReplayFilter{CreatedTo: time.Now().Add(-24 * time.Hour)}, evs[0])
		replayed(sqlxoutbox.ReplayFilter{CreatedFrom: time.Now().Add(-time.Hour), FromSeq: evs[9].Seq}, evs[9])
		replayed(sqlxoutbox.ReplayFilter{All: true}, evs...)
	})
}

func TestGetAndOptions(t *testing.T) {
	t.Parallel()
	if _, err := sqlxoutbox.New(nil, sqlxoutbox.Options{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("New(nil) = %v", err)
	}
	b := backends[1]
	db := b.open(t)
	if _, err := sqlxoutbox.New(db, sqlxoutbox.Options{Table: "outbox; DROP TABLE orders"}); !errors.Is(err, dialect.ErrInvalidIdentifier) {
		t.Errorf("New(bad table) = %v, want ErrInvalidIdentifier", err)
	}
	box, err := sqlxoutbox.NewDB(db.DB, sqlxoutbox.Options{})
	if err != nil || box.Dialect() != dialect.SQLite {
		t.Fatalf("NewDB detected %v, %v", box.Dialect(), err)
	}
	if c := box.Capabilities(); c != (core.StoreCapabilities{OrderedClaims: true, MaxConcurrency: 1}) || box.Wakeups() == nil {
		t.Errorf("SQLite capabilities %+v, wake-ups %p; want one claim at a time, ordered claims of every partition and a wake-up signal", c, box.Wakeups())
	}
	if _, err := box.NewLeaser(core.LeaserConfig{PartitionCount: 4}); !errors.Is(err, core.ErrUnsupported) {
		t.Errorf("SQLite NewLeaser = %v, want core.ErrUnsupported", err)
	}
	e := newEnv(t, b, sqlxoutbox.Options{})
	ctx := context.Background()
	ev := e.enqueue(t, true, events(1, "x", 1)...)[0]
	if got, err := e.box.GetBySeq(ctx, ev.Seq); err != nil || got.ID != ev.ID {
		t.Errorf("GetBySeq = %+v, %v", got, err)
	}
	if _, err := e.box.GetBySeq(ctx, ev.Seq+100); !errors.Is(err, core.ErrEventNotFound) {
		t.Errorf("GetBySeq(missing) = %v", err)
	}
	if _, err := e.box.Get(ctx, "not-a-uuid"); !errors.Is(err, dialect.ErrInvalidFilter) {
		t.Errorf("Get(not-a-uuid) = %v", err)
	}
}

// A custom, schema-qualified table name works end to end.
func TestCustomTable(t *testing.T) {
	t.Parallel()
	b := backends[0]
	db := b.open(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA shop"); err != nil {
		t.Fatal(err)
	}
	opts := sqlxoutbox.Options{Table: "shop.events"}
	if err := dialect.Migrate(ctx, db.DB, b.d, dialect.MigrateOptions{Table: opts.Table, SkipInbox: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	box, err := sqlxoutbox.New(db, opts)
	if err != nil {
		t.Fatal(err)
	}
	evs := events(3, "x", 1)
	enqueueCommitted(t, ctx, db, box, evs...)
	c, err := box.Claim(ctx, core.ClaimRequest{Limit: 10})
	if err != nil || len(c.Events()) != 3 {
		t.Fatalf("Claim = %v, %v", c, err)
	}
	if err := c.Commit(ctx, core.Outcome{Published: seqsOf(c.Events())}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.GetContext(ctx, &n, "SELECT count(*) FROM shop.events WHERE published_at IS NOT NULL"); err != nil || n != 3 {
		t.Errorf("published in shop.events = %d, %v", n, err)
	}
}

// Values never reach the SQL text: hostile strings are stored and matched
// verbatim.
func TestHostileValuesAreBound(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		const evil = `x'); DROP TABLE orders; -- ? $1 "`
		ev := core.Event{AggregateType: evil, AggregateID: evil, EventType: evil, Payload: []byte(`{"s": "` + strings.ReplaceAll(evil, `"`, `\"`) + `"}`), Headers: map[string]string{evil: evil}}
		evs := e.enqueue(t, true, ev)
		got := e.get(t, evs[0].ID)
		if got.EventType != evil || got.AggregateID != evil || got.Headers[evil] != evil {
			t.Errorf("stored %+v", got)
		}
		c := e.claim(t, 10)
		if err := c.Commit(ctx, core.Outcome{Failed: []core.Failure{{Seq: evs[0].Seq, Err: evil, Dead: true}}}); err != nil {
			t.Fatal(err)
		}
		dead, err := e.box.ListDead(ctx, sqlxoutbox.DeadFilter{EventType: evil}, sqlxoutbox.Page{})
		if err != nil || len(dead) != 1 || dead[0].LastError != evil {
			t.Errorf("ListDead(evil type) = %v, %v", dead, err)
		}
		if n, err := e.box.RetryDead(ctx, sqlxoutbox.DeadFilter{EventType: evil}); err != nil || n != 1 {
			t.Errorf("RetryDead(evil type) = %d, %v", n, err)
		}
		var orders int
		if err := e.db.GetContext(ctx, &orders, "SELECT count(*) FROM orders"); err != nil || orders != 1 {
			t.Errorf("orders table: %d rows, %v", orders, err)
		}
	})
}

// With SkipReadBack, Enqueue writes the same rows in the same order and
// writes back the IDs only: Seq and CreatedAt stay zero.
func TestEnqueueSkipReadBack(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b, sqlxoutbox.Options{SkipReadBack: true})
			const n = dialect.MaxInsertRows + 5 // two INSERT statements
			evs := e.enqueue(t, true, events(n, "plain", 3)...)
			one := e.enqueue(t, true, events(1, "one", 1)...)
			evs = append(evs, one...)
			for i := range evs {
				if evs[i].ID == "" || evs[i].Seq != 0 || !evs[i].CreatedAt.IsZero() {
					t.Fatalf("event %d: ID %q, Seq %d, CreatedAt %v; want an ID and nothing read back", i, evs[i].ID, evs[i].Seq, evs[i].CreatedAt)
				}
			}
			for _, i := range []int{0, n - 1, n} {
				if got := e.get(t, evs[i].ID); got.EventType != evs[i].EventType || got.Headers["n"] != evs[i].Headers["n"] {
					t.Errorf("event %d: stored %+v", i, got)
				}
			}
			c := e.claim(t, n+1)
			defer c.Release(context.Background())
			got := c.Events()
			if len(got) != n+1 {
				t.Fatalf("claimed %d events, want %d", len(got), n+1)
			}
			for i := range got {
				if got[i].ID != evs[i].ID {
					t.Fatalf("claim %d is %s, enqueued %s: not in enqueue order", i, got[i].ID, evs[i].ID)
				}
			}
			// A rolled-back transaction leaves nothing.
			gone := e.enqueue(t, false, events(2, "gone", 1)...)
			if _, err := e.box.Get(context.Background(), gone[0].ID); !errors.Is(err, core.ErrEventNotFound) {
				t.Errorf("Get of a rolled-back event: %v, want ErrEventNotFound", err)
			}
		})
	}
}
