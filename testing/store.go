package outboxtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// RunStore proves a core.Store on a real database: committed events are
// published at least once, rolled-back events never; concurrent claims never
// share an event; a crash between publish and mark re-publishes (a duplicate
// the suite detects); failures are recorded and retried after their backoff;
// events are dead-lettered after their last attempt and kept; cleanup deletes
// only old published events, in bounded batches; stats report the lag.
func RunStore(t *testing.T, newStore NewStoreFunc) {
	t.Run("RoundTripsEveryField", func(t *testing.T) {
		t.Parallel()
		f := newStore(t)
		ctx := t.Context()
		evs := suiteEvents(t, uniqueType("fields"), 1, 1)
		evs[0].Payload = json.RawMessage(`{"total": 12.5, "items": ["a", "b"], "note": "naïve ✓"}`)
		evs[0].Headers = map[string]string{"tenant": "acme", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
		mustEnqueue(t, f, evs, true)
		claim := mustClaim(t, f, 10)
		got := claim.Events()
		if len(got) != 1 {
			t.Fatalf("claimed %d events, want 1", len(got))
		}
		g, w := got[0], evs[0]
		if g.ID != w.ID || g.AggregateType != w.AggregateType || g.AggregateID != w.AggregateID || g.EventType != w.EventType {
			t.Errorf("claimed %+v, want identity of %+v", g, w)
		}
		if !jsonEqual(g.Payload, w.Payload) {
			t.Errorf("payload %s, want %s", g.Payload, w.Payload)
		}
		if !maps.Equal(g.Headers, w.Headers) {
			t.Errorf("headers %v, want %v", g.Headers, w.Headers)
		}
		if g.Seq <= 0 || g.CreatedAt.IsZero() || g.AttemptCount != 0 || g.PublishedAt != nil || g.DeadAt != nil {
			t.Errorf("bookkeeping of a new event: %+v", g)
		}
		if err := claim.Commit(ctx, core.Outcome{Published: []int64{g.Seq}}); err != nil {
			t.Fatal(err)
		}
		if err := claim.Commit(ctx, core.Outcome{}); !errors.Is(err, core.ErrClaimDone) {
			t.Errorf("second Commit = %v, want ErrClaimDone", err)
		}
		if err := claim.Release(ctx); !errors.Is(err, core.ErrClaimDone) {
			t.Errorf("Release after Commit = %v, want ErrClaimDone", err)
		}
		stored := mustGet(t, f, w.ID)
		if stored.PublishedAt == nil || stored.AttemptCount != 1 {
			t.Errorf("after publish: PublishedAt=%v AttemptCount=%d, want set and 1", stored.PublishedAt, stored.AttemptCount)
		}
		if c := mustClaim(t, f, 10); len(c.Events()) != 0 {
			t.Errorf("a published event was claimed again: %d events", len(c.Events()))
		}
	})

	t.Run("CommittedDeliveredRolledBackNever", func(t *testing.T) {
		t.Parallel()
		f := newStore(t)
		et := uniqueType("commit")
		committed := suiteEvents(t, et, 150, 10)
		rolledBack := suiteEvents(t, et, 30, 10)
		for i := 0; i < len(committed); i += 50 {
			mustEnqueue(t, f, committed[i:i+50], true)
			mustEnqueue(t, f, rolledBack[i/5:i/5+10], false)
		}
		rec := NewRecorder()
		relay := mustRelay(t, f, rec, core.RelayOptions{BatchSize: 40})
		res, err := relay.Drain(t.Context())
		if err != nil {
			t.Fatalf("Drain: %v", err)
		}
		if res.Published != int64(len(committed)) {
			t.Errorf("published %d, want %d", res.Published, len(committed))
		}
		for _, ev := range committed {
			if n := rec.Count(ev.ID); n != 1 {
				t.Errorf("committed event %s published %d times, want 1", ev.ID, n)
			}
		}
		for _, ev := range rolledBack {
			if n := rec.Count(ev.ID); n != 0 {
				t.Errorf("rolled-back event %s was published %d times", ev.ID, n)
			}
			if _, err := f.Get(t.Context(), ev.ID); !errors.Is(err, core.ErrEventNotFound) {
				t.Errorf("Get(rolled back %s) = %v, want ErrEventNotFound", ev.ID, err)
			}
		}
	})

	t.Run("ClaimsOldestFirstWithinLimit", func(t *testing.T) {
		t.Parallel()
		f := newStore(t)
		evs := suiteEvents(t, uniqueType("fifo"), 30, 1)
		for i := range evs {
			mustEnqueue(t, f, evs[i:i+1], true)
		}
		claim := mustClaim(t, f, 12)
		got := claim.Events()
		if len(got) != 12 {
			t.Fatalf("claimed %d events with limit 12", len(got))
		}
		for i, ev := range got {
			if ev.ID != evs[i].ID {
				t.Fatalf("claim #%d is %s, want %s (oldest first)", i, ev.ID, evs[i].ID)
			}
		}
		if err := claim.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ConcurrentRelaysNeverDoublePublish", func(t *testing.T) {
		t.Parallel()
		f := newStore(t)
		evs := suiteEvents(t, uniqueType("concurrent"), 2000, 50)
		for i := 0; i < len(evs); i += 500 {
			mustEnqueue(t, f, evs[i:i+500], true)
		}
		rec := NewRecorder()
		// Four relays, as four processes would run them; each relay's own
		// workers are capped by the store's MaxConcurrency.
		const relays = 4
		var wg sync.WaitGroup
		errs := make(chan error, relays)
		for range relays {
			r := mustRelay(t, f, rec, core.RelayOptions{BatchSize: 50, Concurrency: 2, Ordering: core.OrderingOff})
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := r.Drain(t.Context()); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("Drain: %v", err)
		}
		if rec.Distinct() != len(evs) || rec.Duplicates() != 0 {
			t.Errorf("%d relays published %d distinct events with %d duplicates, want %d and 0",
				relays, rec.Distinct(), rec.Duplicates(), len(evs))
		}
		// Two claims open at the same time hold disjoint events, whatever
		// the store's concurrency: a second relay process may always claim.
		more := suiteEvents(t, uniqueType("disjoint"), 20, 5)
		mustEnqueue(t, f, more, true)
		a, b := mustClaim(t, f, 10), mustClaim(t, f, 20)
		seen := map[int64]bool{}
		for _, ev := range append(a.Events(), b.Events()...) {
			if seen[ev.Seq] {
				t.Errorf("event %d held by two open claims", ev.Seq)
			}
			seen[ev.Seq] = true
		}
		if len(seen) != 20 {
			t.Errorf("two open claims hold %d events, want 20", len(seen))
		}
		_ = a.Release(t.Context())
		_ = b.Release(t.Context())
	})

	// A relay that dies between publish and mark leaves its claim open
	// until its connection goes (or its lease ends): the events must then
	// be claimable again, and be published a second time.
	t.Run("CrashBetweenPublishAndMarkRepublishes", func(t *testing.T) {
		t.Parallel()
		f := newStore(t)
		if f.Crash == nil {
			t.Fatal("StoreFixture needs Crash: abandon the open claims as a dead relay does (kill their connections)")
		}
		evs := suiteEvents(t, uniqueType("crash"), 10, 2)
		mustEnqueue(t, f, evs, true)
		rec := NewRecorder()
		claim := mustClaim(t, f, 100)
		if len(claim.Events()) != len(evs) {
			t.Fatalf("claimed %d events, want %d", len(claim.Events()), len(evs))
		}
		if err := rec.Publish(t.Context(), claim.Events()); err != nil {
			t.Fatal(err)
		}
		// The relay dies here: no Commit, no Release.
		if err := f.Crash(t.Context()); err != nil {
			t.Fatalf("Crash: %v", err)
		}
		relay := mustRelay(t, f, rec, core.RelayOptions{})
		// Nothing changes before the crashed claim's lease runs out: the
		// stall limit counts from there.
		wait.ForStall(t, "the abandoned events to be published again (the crashed claim still holds them?)", f.ClaimLease+envDeliveryTimeout(t), func() (bool, any) {
			if rec.Distinct() >= len(evs) && rec.Duplicates() >= len(evs) {
				return true, nil
			}
			if _, err := relay.Drain(t.Context()); err != nil {
				t.Logf("Drain after the crash: %v", err) // a pool may hand out a killed connection once
			}
			return false, fmt.Sprintf("%d of %d published again", rec.Duplicates(), len(evs))
		})
		for _, ev := range evs {
			if n := rec.Count(ev.ID); n != 2 {
				t.Errorf("event %s published %d times after a crash, want 2 (the duplicate)", ev.ID, n)
			}
			if s := mustGet(t, f, ev.ID); s.PublishedAt == nil {
				t.Errorf("event %s not marked published after its second publish", ev.ID)
			}
		}
	})

	t.Run("FailuresRecordedAndRetriedAfterBackoff", func(t *testing.T) {
		t.Parallel()
		f := newStore(t)
		evs := suiteEvents(t, uniqueType("retry"), 5, 5)
		mustEnqueue(t, f, evs, true)
		bad := evs[2].ID
		failing := true
		rec := NewRecorder()
		pub := core.PublisherFunc(func(ctx context.Context, batch []core.Event) error {
			be := core.NewBatchError(len(batch))
			var ok []core.Event
			for i, ev := range batch {
				if ev.ID == bad && failing {
					be.Errs[i] = fmt.Errorf("broker said no to %s", ev.ID)
					continue
				}
				ok = append(ok, ev)
			}
			_ = rec.Publish(ctx, ok)
			return be.ErrOrNil()
		})
		backoff := 1500 * time.Millisecond
		relay := mustRelay(t, f, pub, core.RelayOptions{Retry: core.RetryPolicy{InitialBackoff: backoff, Jitter: -1}})
		res, err := relay.ProcessBatch(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if res.Published != 4 || res.Failed != 1 {
			t.Fatalf("batch: %+v, want 4 published and 1 failed (one failure must not fail the batch)", res)
		}
		stored := mustGet(t, f, bad)
		if stored.AttemptCount != 1 || stored.LastError == "" || stored.PublishedAt != nil {
			t.Errorf("failed event: attempts=%d last_error=%q published=%v", stored.AttemptCount, stored.LastError, stored.PublishedAt)
		}
		if wait := stored.NextAttemptAt.Sub(stored.CreatedAt); wait < backoff-100*time.Millisecond {
			t.Errorf("next attempt %v after creation, want at least the backoff %v", wait, backoff)
		}
		if res, err := relay.ProcessBatch(t.Context()); err != nil || res.Claimed != 0 {
			t.Errorf("during backoff: claimed %d (err %v), want 0", res.Claimed, err)
		}
		failing = false
		// Nothing can change before the backoff ends.
		wait.ForStall(t, "the retry after the backoff", backoff+envDeliveryTimeout(t), func() (bool, any) {
			if rec.Count(bad) > 0 {
				return true, nil
			}
			if _, err := relay.ProcessBatch(t.Context()); err != nil {
				t.Fatal(err)
			}
			return false, nil
		})
		stored = mustGet(t, f, bad)
		if rec.Count(bad) != 1 || stored.PublishedAt == nil || stored.AttemptCount != 2 {
			t.Errorf("after backoff: published %d times, PublishedAt=%v, attempts=%d; want 1, set, 2",
				rec.Count(bad), stored.PublishedAt, stored.AttemptCount)
		}
		if stored.LastError != "" {
			t.Errorf("published after a failed attempt, the event still shows its old error %q", stored.LastError)
		}
	})

	t.Run("DeadLettersAfterMaxAttempts", func(t *testing.T) {
		t.Parallel()
		f := newStore(t)
		evs := suiteEvents(t, uniqueType("dead"), 1, 1)
		mustEnqueue(t, f, evs, true)
		pub := core.PublisherFunc(func(context.Context, []core.Event) error { return errors.New("poison") })
		relay := mustRelay(t, f, pub, core.RelayOptions{Retry: core.RetryPolicy{MaxAttempts: 3, InitialBackoff: 20 * time.Millisecond, Jitter: -1}})
		var stored core.Event
		wait.ForStall(t, "the event dead-lettered", envDeliveryTimeout(t), func() (bool, any) {
			if _, err := relay.ProcessBatch(t.Context()); err != nil {
				t.Fatal(err)
			}
			stored = mustGet(t, f, evs[0].ID)
			return stored.DeadAt != nil, stored.AttemptCount
		})
		if stored.DeadAt == nil || stored.AttemptCount != 3 || stored.LastError != "poison" {
			t.Fatalf("after 3 failures: dead=%v attempts=%d last_error=%q", stored.DeadAt, stored.AttemptCount, stored.LastError)
		}
		time.Sleep(50 * time.Millisecond)
		if res, _ := relay.ProcessBatch(t.Context()); res.Claimed != 0 {
			t.Errorf("a dead event was claimed again")
		}
		if c := relay.Counters(); c.DeadLettered != 1 || c.Failed != 3 {
			t.Errorf("counters %+v, want 1 dead-lettered of 3 failures", c)
		}
		s, err := statsReader(t, f).Stats(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if s.Dead != 1 || s.Pending != 0 {
			t.Errorf("stats %+v, want 1 dead and 0 pending", s)
		}
	})

	t.Run("CleanupDeletesOnlyOldPublishedInBatches", func(t *testing.T) {
		t.Parallel()
		f := newStore(t)
		if f.Backdate == nil {
			t.Fatal("StoreFixture needs Backdate")
		}
		ctx := t.Context()
		et := uniqueType("cleanup")
		published := suiteEvents(t, et, 30, 3)
		mustEnqueue(t, f, published, true)
		if _, err := mustRelay(t, f, NewRecorder(), core.RelayOptions{}).Drain(ctx); err != nil {
			t.Fatal(err)
		}
		pending := suiteEvents(t, et, 5, 3)
		mustEnqueue(t, f, pending, true)
		old := 40 * 24 * time.Hour
		for _, ev := range append(published[:23:23], pending...) {
			if err := f.Backdate(ctx, ev.ID, old); err != nil {
				t.Fatal(err)
			}
		}
		var progress []int64
		n, err := core.Cleanup(ctx, cleaner(t, f), core.CleanupOptions{BatchSize: 7, OnProgress: func(d int64) { progress = append(progress, d) }})
		if err != nil {
			t.Fatal(err)
		}
		if n != 23 {
			t.Errorf("cleanup deleted %d, want the 23 old published events", n)
		}
		if want := []int64{7, 14, 21, 23}; fmt.Sprint(progress) != fmt.Sprint(want) {
			t.Errorf("progress %v, want batches of at most 7: %v", progress, want)
		}
		for i, ev := range published {
			_, err := f.Get(ctx, ev.ID)
			if gone := errors.Is(err, core.ErrEventNotFound); gone != (i < 23) {
				t.Errorf("published event %d: deleted=%v, want %v (err %v)", i, gone, i < 23, err)
			}
		}
		for _, ev := range pending {
			if _, err := f.Get(ctx, ev.ID); err != nil {
				t.Errorf("an old pending event was deleted: %v", err)
			}
		}
	})

	t.Run("StatsAndLagMonitor", func(t *testing.T) {
		t.Parallel()
		f := newStore(t)
		if f.Backdate == nil {
			t.Fatal("StoreFixture needs Backdate")
		}
		ctx := t.Context()
		evs := suiteEvents(t, uniqueType("stats"), 4, 2)
		mustEnqueue(t, f, evs, true)
		if err := f.Backdate(ctx, evs[1].ID, 2*time.Hour); err != nil {
			t.Fatal(err)
		}
		var lagged core.Stats
		m, err := core.NewMonitor(statsReader(t, f), core.MonitorOptions{Logger: testLogger(t), LagThreshold: time.Hour, OnLag: func(_ context.Context, s core.Stats) { lagged = s }})
		if err != nil {
			t.Fatal(err)
		}
		s, lagging, err := m.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.Pending != 4 || s.Dead != 0 {
			t.Errorf("stats %+v, want 4 pending, 0 dead", s)
		}
		if s.OldestPendingAge < 2*time.Hour || s.OldestPendingAge > 2*time.Hour+time.Minute {
			t.Errorf("oldest pending age %v, want about 2h", s.OldestPendingAge)
		}
		if !lagging || lagged.Pending != 4 {
			t.Errorf("monitor: lagging=%v OnLag got %+v, want lagging with the stats", lagging, lagged)
		}
		if bt, ok := s.ByType[evs[0].EventType]; s.ByType != nil && (!ok || bt.Pending != 4) {
			t.Errorf("stats by type %+v, want 4 pending of %s", s.ByType, evs[0].EventType)
		}
		if _, err := mustRelay(t, f, NewRecorder(), core.RelayOptions{}).Drain(ctx); err != nil {
			t.Fatal(err)
		}
		s, lagging, err = m.Check(ctx)
		if err != nil || s.Pending != 0 || lagging || s.OldestPendingAge != 0 {
			t.Errorf("after drain: %+v lagging=%v err=%v, want nothing pending", s, lagging, err)
		}
	})

	// A scheduled event (core.Event.NotBefore) is not claimed before its
	// time, is not lag while it waits, and is published soon after its
	// time by a relay that would otherwise sleep a whole poll interval.
	t.Run("ScheduledEventsWaitForTheirTime", func(t *testing.T) {
		t.Parallel()
		f := newStore(t)
		ctx := t.Context()
		evs := suiteEvents(t, uniqueType("scheduled"), 4, 4)
		soon, now, past, tomorrow := &evs[0], &evs[1], &evs[2], &evs[3]
		const delay = 2 * time.Second
		soon.NotBefore = time.Now().Add(delay)
		past.NotBefore = time.Now().Add(-time.Hour)
		tomorrow.NotBefore = time.Now().Add(24 * time.Hour)
		mustEnqueue(t, f, evs, true)
		// The checks up to the relay's run need soon not yet due. On a
		// machine so slow that it fell due first, they judge nothing: the
		// test says so and stops (never early is judged below, and in
		// RunScheduled, whenever soon is published).
		beforeDue := func(what string) bool {
			if time.Now().Before(soon.NotBefore) {
				return true
			}
			t.Logf("the event scheduled %v ahead fell due before %s ended: nothing more to judge here", delay, what)
			return false
		}

		st, err := statsReader(t, f).Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !beforeDue("the stats") {
			return
		}
		// The past NotBefore means now: it does not date the event's lag
		// an hour back.
		if st.Pending != 2 || st.Scheduled != 2 || st.OldestPendingAge > time.Minute {
			t.Errorf("stats %+v, want 2 pending (due), 2 scheduled, the oldest pending a moment old", st)
		}
		for _, ev := range []*core.Event{soon, tomorrow} {
			if got := mustGet(t, f, ev.ID).NextAttemptAt; got.Before(ev.NotBefore) {
				t.Errorf("event stored to be due at %v, before its NotBefore %v", got, ev.NotBefore)
			}
		}
		c := mustClaim(t, f, 10)
		var got []string
		for _, ev := range c.Events() {
			got = append(got, ev.ID)
		}
		if !beforeDue("the claim") {
			return
		}
		if len(got) != 2 || !slices.Contains(got, now.ID) || !slices.Contains(got, past.ID) {
			t.Fatalf("claimed %v, want only the unscheduled %s and the one scheduled in the past %s", got, now.ID, past.ID)
		}
		if err := c.Commit(ctx, core.Outcome{Published: []int64{c.Events()[0].Seq, c.Events()[1].Seq}}); err != nil {
			t.Fatal(err)
		}
		m, err := core.NewMonitor(statsReader(t, f), core.MonitorOptions{Logger: testLogger(t), LagThreshold: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		st, lagging, err := m.Check(ctx)
		if !beforeDue("the monitor's check") {
			return
		}
		if err != nil || lagging || st.Pending != 0 || st.Scheduled != 2 {
			t.Errorf("scheduled backlog: %+v lagging=%v err=%v, want 0 pending, 2 scheduled, no lag", st, lagging, err)
		}

		// The relay polls once an hour; the scheduled event must not wait
		// for the next poll when the store can tell when it falls due
		// (then it is published at all only thanks to that).
		var mu sync.Mutex
		published := map[string]time.Time{}
		pub := core.PublisherFunc(func(_ context.Context, batch []core.Event) error {
			mu.Lock()
			defer mu.Unlock()
			for _, ev := range batch {
				if _, ok := published[ev.ID]; !ok {
					published[ev.ID] = time.Now()
				}
			}
			return nil
		})
		relay := mustRelay(t, f, pub, core.RelayOptions{PollInterval: time.Hour})
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- relay.Run(rctx) }()
		if _, ok := core.StoreAs[core.NextDueReader](f.Store); ok {
			// Nothing is due before NotBefore.
			wait.ForStall(t, "the scheduled event published on its NextDue wake-up", delay+envDeliveryTimeout(t), func() (bool, any) {
				mu.Lock()
				defer mu.Unlock()
				_, ok := published[soon.ID]
				return ok, nil
			})
		} else {
			time.Sleep(delay) // a window for an early publish to show
		}
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		at, ok := published[soon.ID]
		switch {
		case ok && at.Before(soon.NotBefore):
			t.Errorf("the scheduled event was published %v early", soon.NotBefore.Sub(at))
		}
		if _, ok := published[tomorrow.ID]; ok {
			t.Error("the event scheduled for tomorrow was published")
		}
	})

	// Bad input is refused before anything is written, with an error
	// wrapping core.ErrInvalidEvent, and the caller's transaction stays
	// usable: a database that refused the row would abort it, and the
	// caller's business row with it.
	t.Run("RejectsInvalidEventsKeepingTheTransaction", func(t *testing.T) {
		t.Parallel()
		f := newStore(t)
		if f.EnqueueThenCommit == nil {
			t.Fatal("StoreFixture needs EnqueueThenCommit")
		}
		for name, ev := range InvalidEvents() {
			enqErr, commitErr := f.EnqueueThenCommit(t.Context(), []core.Event{ev})
			if !errors.Is(enqErr, core.ErrInvalidEvent) {
				t.Errorf("%s: Enqueue = %v, want an error wrapping ErrInvalidEvent", name, enqErr)
			}
			if commitErr != nil {
				t.Errorf("%s: the caller's transaction could not commit after the refused Enqueue: %v", name, commitErr)
			}
		}
		if c := mustClaim(t, f, 100); len(c.Events()) != 0 {
			t.Errorf("invalid events were stored: %d", len(c.Events()))
		}
	})

	// An event that one database cannot store (JSONBInvalidEvents) is
	// refused before anything is written, or stored as it is: never
	// written and refused by the database, which on PostgreSQL would abort
	// the caller's transaction.
	t.Run("EventsSomeDatabasesCannotStore", func(t *testing.T) {
		t.Parallel()
		f := newStore(t)
		if f.EnqueueThenCommit == nil || f.Get == nil {
			t.Fatal("StoreFixture needs EnqueueThenCommit and Get")
		}
		for name, ev := range JSONBInvalidEvents() {
			ev.ID = uuid.Must(uuid.NewV7()).String()
			enqErr, commitErr := f.EnqueueThenCommit(t.Context(), []core.Event{ev})
			if commitErr != nil {
				t.Errorf("%s: the caller's transaction could not commit after Enqueue (%v): %v", name, enqErr, commitErr)
				continue
			}
			if enqErr != nil {
				if !errors.Is(enqErr, core.ErrInvalidEvent) {
					t.Errorf("%s: Enqueue = %v, want it stored or an error wrapping ErrInvalidEvent", name, enqErr)
				}
				if _, err := f.Get(t.Context(), ev.ID); !errors.Is(err, core.ErrEventNotFound) {
					t.Errorf("%s: refused, yet stored (Get: %v)", name, err)
				}
				continue
			}
			if got := mustGet(t, f, ev.ID); string(got.Payload) != string(ev.Payload) {
				t.Errorf("%s: stored payload %.60q, want %.60q as given", name, got.Payload, ev.Payload)
			}
		}
	})
}

// JSONBInvalidEvents returns, by name, events that core.Event.Validate
// accepts and that PostgreSQL's jsonb cannot store (dialect.Dialect.CheckEvents
// names the rules). An adapter on PostgreSQL must refuse them with an error
// wrapping core.ErrInvalidEvent before writing anything; one on a database
// that keeps the payload as text may store them as they are.
func JSONBInvalidEvents() map[string]core.Event {
	ev := func(payload string) core.Event {
		return core.Event{EventType: "suite.jsonb", AggregateType: "suite", AggregateID: "a-1", Payload: json.RawMessage(payload)}
	}
	return map[string]core.Event{
		"payload with \\u0000":          ev(`{"s":"a\u0000b"}`),
		"payload with a lone surrogate": ev(`{"s":"\ud800"}`),
		"payload number out of range":   ev(`{"n":1e200000}`),
	}
}

// InvalidEvents returns, by name, events that every adapter must refuse
// with an error wrapping core.ErrInvalidEvent before writing anything: one
// for each rule of core.Event.Validate under core.DefaultLimits. What only
// some databases refuse is in JSONBInvalidEvents.
func InvalidEvents() map[string]core.Event {
	ok := func(mod func(*core.Event)) core.Event {
		ev := core.Event{EventType: "suite.invalid", AggregateType: "suite", AggregateID: "a-1", Payload: json.RawMessage(`{"n":1}`)}
		mod(&ev)
		return ev
	}
	long := strings.Repeat("x", core.MaxNameBytes+1)
	manyHeaders := map[string]string{}
	for i := range core.DefaultMaxHeaders + 1 {
		manyHeaders[fmt.Sprintf("h%d", i)] = "v"
	}
	return map[string]core.Event{
		"empty event type":  ok(func(e *core.Event) { e.EventType = "" }),
		"payload not JSON":  ok(func(e *core.Event) { e.Payload = json.RawMessage(`{not json`) }),
		"ID not a UUID":     ok(func(e *core.Event) { e.ID = "not-a-uuid" }),
		"payload not UTF-8": ok(func(e *core.Event) { e.Payload = json.RawMessage("{\"s\":\"\xff\"}") }),
		"payload over the limit": ok(func(e *core.Event) {
			e.Payload = json.RawMessage(`"` + strings.Repeat("p", core.DefaultMaxPayloadBytes) + `"`)
		}),
		"NUL in event type":        ok(func(e *core.Event) { e.EventType = "order\x00created" }),
		"event type too long":      ok(func(e *core.Event) { e.EventType = long }),
		"aggregate type not UTF-8": ok(func(e *core.Event) { e.AggregateType = "agg\xff" }),
		"aggregate id too long":    ok(func(e *core.Event) { e.AggregateID = long }),
		"NUL in aggregate id":      ok(func(e *core.Event) { e.AggregateID = "a\x00" }),
		"header key too long":      ok(func(e *core.Event) { e.Headers = map[string]string{long: "v"} }),
		"NUL in header key":        ok(func(e *core.Event) { e.Headers = map[string]string{"k\x00": "v"} }),
		"empty header key":         ok(func(e *core.Event) { e.Headers = map[string]string{"": "v"} }),
		"header value not UTF-8":   ok(func(e *core.Event) { e.Headers = map[string]string{"k": "v\xff"} }),
		"NUL in header value":      ok(func(e *core.Event) { e.Headers = map[string]string{"k": "v\x00"} }),
		"too many headers":         ok(func(e *core.Event) { e.Headers = manyHeaders }),
		"headers too large": ok(func(e *core.Event) {
			e.Headers = map[string]string{"k": strings.Repeat("v", core.DefaultMaxHeaderBytes)}
		}),
	}
}

// statsReader returns the fixture's store as a core.StatsReader: optional
// for the relay, but the lag monitor of every outbox in production reads
// it, so the suite proves it.
func statsReader(t *testing.T, f *StoreFixture) core.StatsReader {
	return optional[core.StatsReader](t, f, "Stats, which the lag monitor reads")
}

// cleaner returns the fixture's store as a core.Cleaner, which retention
// needs: the suite proves it.
func cleaner(t *testing.T, f *StoreFixture) core.Cleaner {
	return optional[core.Cleaner](t, f, "DeletePublished, which retention runs")
}

// optional returns the optional interface T of the fixture's store, and
// fails the test, naming what the suite proves, when the store has none.
func optional[T any](t *testing.T, f *StoreFixture, what string) T {
	t.Helper()
	v, ok := core.StoreAs[T](f.Store)
	if !ok {
		t.Fatalf("the store %T is no %T: the suite proves its %s", f.Store, (*T)(nil), what)
	}
	return v
}

func mustEnqueue(t *testing.T, f *StoreFixture, evs []core.Event, commit bool) {
	t.Helper()
	if err := f.Enqueue(t.Context(), evs, commit); err != nil {
		t.Fatalf("Enqueue(%d events, commit=%v): %v", len(evs), commit, err)
	}
}

func mustClaim(t *testing.T, f *StoreFixture, limit int) core.Claim {
	t.Helper()
	c, err := f.Store.Claim(t.Context(), core.ClaimRequest{Limit: limit})
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	t.Cleanup(func() { _ = c.Release(context.Background()) })
	return c
}

func mustGet(t *testing.T, f *StoreFixture, id string) core.Event {
	t.Helper()
	ev, err := f.Get(t.Context(), id)
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	return ev
}

func mustRelay(t *testing.T, f *StoreFixture, pub core.Publisher, opts core.RelayOptions) *core.Relay {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	r, err := core.NewRelay(f.Store, pub, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ja, _ := json.Marshal(x)
	jb, _ := json.Marshal(y)
	return string(ja) == string(jb)
}
