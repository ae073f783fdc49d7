package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// InboxFixture is a fresh consumer database, made for one subtest: a
// migrated, empty inbox table, and the consumer's own table in which the
// suite's handlers leave their effects.
type InboxFixture struct {
	// Inbox is the inbox under test.
	Inbox core.Inbox
	// Effect writes one row for key into the consumer's own table through
	// the transaction that ctx carries (the one Inbox.Process opened), so
	// that the row commits or rolls back with the inbox record. It must not
	// deduplicate: a second call for one key adds a second row, so that the
	// suite sees every double effect.
	Effect func(ctx context.Context, key string) error
	// Effects counts the committed rows of the consumer's own table per
	// key, reading outside any inbox transaction.
	Effects func(ctx context.Context) (map[string]int, error)
	// Processed reports whether (consumer, eventID) is recorded.
	Processed func(ctx context.Context, consumer, eventID string) (bool, error)
	// Cleaner deletes old records (usually the Inbox itself).
	Cleaner inbox.Cleaner
	// Backdate moves the processed_at of a record back by age, so that
	// retention can be tested without waiting.
	Backdate func(ctx context.Context, consumer, eventID string, age time.Duration) error
	// Timeout is how long a concurrency check (many deliveries of one
	// event at once) may go without a delivery finishing. Default:
	// TXOUTBOX_TEST_DELIVERY_TIMEOUT, or DefaultDeliveryTimeout. An inbox whose deliveries take turns on one
	// lock (SQLite without busy_timeout, its Process polling) may need
	// more, as much as it lets Process wait.
	Timeout time.Duration
}

// timeout is f.Timeout, or the suite's delivery timeout.
func (f *InboxFixture) timeout(t testing.TB) time.Duration {
	if f.Timeout > 0 {
		return f.Timeout
	}
	return envDeliveryTimeout(t)
}

// NewInboxFunc makes an InboxFixture for one subtest. It registers its own
// cleanup with t.Cleanup.
type NewInboxFunc func(t *testing.T) *InboxFixture

// errInboxHandler is the failure the suite's handlers inject.
var errInboxHandler = errors.New("outboxtest: injected handler failure")

// inboxHold is how long the lock tests hold a transaction open while a
// concurrent duplicate waits; long enough to tell waiting from racing
// through, short enough for SQLite's busy timeout.
const inboxHold = 300 * time.Millisecond

// RunInbox proves a core.Inbox: an event takes effect once per consumer;
// a failing or panicking handler rolls back its effect and the record
// together, so that a redelivery runs it again; an empty event ID is
// refused; concurrent duplicates take effect once, the later one waiting
// for the earlier one's transaction and then skipping, or running if that
// one rolled back; and retention deletes old records in batches.
func RunInbox(t *testing.T, newInbox NewInboxFunc) {
	t.Run("ProcessesOnce", func(t *testing.T) {
		t.Parallel()
		f := newInbox(t)
		ctx := t.Context()
		id := uuid.NewString()
		for i, want := range []bool{true, false, false} {
			ran := false
			got, err := f.Inbox.Process(ctx, "c1", id, func(ctx context.Context) error {
				ran = true
				return f.Effect(ctx, id)
			})
			if err != nil {
				t.Fatalf("delivery %d: Process: %v", i+1, err)
			}
			if got != want || ran != want {
				t.Fatalf("delivery %d: processed = %v, handler ran = %v; want %v", i+1, got, ran, want)
			}
		}
		inboxWantEffects(t, f, map[string]int{id: 1})
		inboxWantProcessed(t, f, "c1", id, true)
	})

	t.Run("HandlerErrorRollsBackBoth", func(t *testing.T) {
		t.Parallel()
		f := newInbox(t)
		ctx := t.Context()
		id := uuid.NewString()
		processed, err := f.Inbox.Process(ctx, "c1", id, func(ctx context.Context) error {
			if err := f.Effect(ctx, id); err != nil {
				return err
			}
			return errInboxHandler
		})
		if !errors.Is(err, errInboxHandler) || processed {
			t.Fatalf("Process = (%v, %v), want (false, the handler's error)", processed, err)
		}
		inboxWantEffects(t, f, map[string]int{})
		inboxWantProcessed(t, f, "c1", id, false)
		// The redelivery runs the handler again and now takes effect.
		processed, err = f.Inbox.Process(ctx, "c1", id, func(ctx context.Context) error { return f.Effect(ctx, id) })
		if err != nil || !processed {
			t.Fatalf("redelivery: Process = (%v, %v), want (true, nil)", processed, err)
		}
		inboxWantEffects(t, f, map[string]int{id: 1})
		inboxWantProcessed(t, f, "c1", id, true)
	})

	t.Run("HandlerPanicRollsBackBoth", func(t *testing.T) {
		t.Parallel()
		f := newInbox(t)
		ctx := t.Context()
		id := uuid.NewString()
		func() {
			defer func() {
				if p := recover(); p != "boom" {
					t.Fatalf("recovered %v, want the handler's panic to go on", p)
				}
			}()
			_, _ = f.Inbox.Process(ctx, "c1", id, func(ctx context.Context) error {
				if err := f.Effect(ctx, id); err != nil {
					return err
				}
				panic("boom")
			})
		}()
		inboxWantEffects(t, f, map[string]int{})
		inboxWantProcessed(t, f, "c1", id, false)
		// The connection went back to the pool in a usable state.
		if ok, err := f.Inbox.Process(ctx, "c1", id, func(ctx context.Context) error { return f.Effect(ctx, id) }); err != nil || !ok {
			t.Fatalf("after panic: Process = (%v, %v), want (true, nil)", ok, err)
		}
		inboxWantEffects(t, f, map[string]int{id: 1})
	})

	t.Run("ConsumersAreIndependent", func(t *testing.T) {
		t.Parallel()
		f := newInbox(t)
		ctx := t.Context()
		id := uuid.NewString()
		for _, c := range []string{"billing", "inventory", "billing", "inventory"} {
			if _, err := f.Inbox.Process(ctx, c, id, func(ctx context.Context) error { return f.Effect(ctx, c+"/"+id) }); err != nil {
				t.Fatalf("Process(%s): %v", c, err)
			}
		}
		inboxWantEffects(t, f, map[string]int{"billing/" + id: 1, "inventory/" + id: 1})
	})

	t.Run("EmptyEventIDRefused", func(t *testing.T) {
		t.Parallel()
		f := newInbox(t)
		ran := false
		processed, err := f.Inbox.Process(t.Context(), "c1", "", func(ctx context.Context) error { ran = true; return nil })
		if !errors.Is(err, core.ErrMissingEventID) || processed || ran {
			t.Fatalf("Process(\"\") = (%v, %v), handler ran %v; want (false, ErrMissingEventID), not run", processed, err, ran)
		}
	})

	t.Run("ConcurrentDuplicatesTakeEffectOnce", func(t *testing.T) {
		t.Parallel()
		f := newInbox(t)
		const events, copies = 20, 4
		var finished atomic.Int64 // Process calls returned: the progress
		ctx := wait.Context(t, "concurrent deliveries", f.timeout(t), func() any { return finished.Load() })
		evIDs := make([]string, events)
		for i := range evIDs {
			evIDs[i] = uuid.NewString()
		}
		var wins [events]atomic.Int32
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, events*copies)
		for i, id := range evIDs {
			for range copies {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start // all copies at once, as two consumer instances would
					ok, err := f.Inbox.Process(ctx, "c1", id, func(ctx context.Context) error {
						if err := f.Effect(ctx, id); err != nil {
							return err
						}
						// Keep the transaction open, so that the other
						// copies really overlap with it.
						time.Sleep(5 * time.Millisecond)
						return nil
					})
					finished.Add(1)
					if err != nil {
						errs <- err
						return
					}
					if ok {
						wins[i].Add(1)
					}
				}()
			}
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("concurrent Process: %v", err)
		}
		want := map[string]int{}
		for i, id := range evIDs {
			want[id] = 1
			if n := wins[i].Load(); n != 1 {
				t.Errorf("event %s: %d of %d concurrent deliveries reported processed, want 1", id, n, copies)
			}
		}
		inboxWantEffects(t, f, want)
	})

	t.Run("DuplicateWaitsForFirstThenSkips", func(t *testing.T) {
		t.Parallel()
		f := newInbox(t)
		first, second := inboxRaceFirstHolds(t, f, nil)
		if first.err != nil || !first.processed {
			t.Fatalf("first delivery: (%v, %v), want (true, nil)", first.processed, first.err)
		}
		if second.err != nil || second.processed || second.ran {
			t.Fatalf("second delivery: (%v, %v), handler ran %v; want (false, nil), not run", second.processed, second.err, second.ran)
		}
		inboxWantEffects(t, f, map[string]int{first.id: 1})
	})

	t.Run("DuplicateTakesOverAfterRollback", func(t *testing.T) {
		t.Parallel()
		f := newInbox(t)
		first, second := inboxRaceFirstHolds(t, f, errInboxHandler)
		if !errors.Is(first.err, errInboxHandler) || first.processed {
			t.Fatalf("first delivery: (%v, %v), want (false, its handler's error)", first.processed, first.err)
		}
		if second.err != nil || !second.processed || !second.ran {
			t.Fatalf("second delivery: (%v, %v), handler ran %v; want (true, nil), run", second.processed, second.err, second.ran)
		}
		inboxWantEffects(t, f, map[string]int{first.id: 1})
		inboxWantProcessed(t, f, "c1", first.id, true)
	})

	t.Run("ManyDuplicatesTakeOverAfterRollbackOnce", func(t *testing.T) {
		t.Parallel()
		f := newInbox(t)
		ctx := wait.Context(t, "the deliveries", f.timeout(t), func() any { return nil })
		id := uuid.NewString()
		inside := make(chan struct{})
		firstDone := make(chan error, 1)
		go func() {
			_, err := f.Inbox.Process(ctx, "c1", id, func(ctx context.Context) error {
				if err := f.Effect(ctx, id); err != nil {
					return err
				}
				close(inside)
				time.Sleep(inboxHold)
				return errInboxHandler
			})
			firstDone <- err
		}()
		<-inside
		// Several duplicates wait on the first's record; when it rolls
		// back they all go for the key at once. On InnoDB all but one of
		// them are deadlock victims, which the inbox must retry, not
		// report: none of them ran its handler yet.
		const waiters = 6
		var wg sync.WaitGroup
		var ran atomic.Int32
		errs := make(chan error, waiters)
		for range waiters {
			wg.Go(func() {
				mine := false
				processed, err := f.Inbox.Process(ctx, "c1", id, func(ctx context.Context) error {
					mine = true
					ran.Add(1)
					return f.Effect(ctx, id)
				})
				if err == nil && processed != mine {
					err = fmt.Errorf("processed = %v, its handler ran = %v", processed, mine)
				}
				errs <- err
			})
		}
		if err := <-firstDone; !errors.Is(err, errInboxHandler) {
			t.Fatalf("first delivery: %v, want its handler's error", err)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("a duplicate failed: %v", err)
			}
		}
		if n := ran.Load(); n != 1 {
			t.Errorf("%d duplicates ran the handler, want 1", n)
		}
		inboxWantEffects(t, f, map[string]int{id: 1})
	})

	t.Run("RetentionDeletesOldRecordsInBatches", func(t *testing.T) {
		t.Parallel()
		f := newInbox(t)
		ctx := t.Context()
		ages := []time.Duration{
			0, 0,
			40 * 24 * time.Hour, // older than the outbox's 30 days: kept by the default
			46 * 24 * time.Hour, 50 * 24 * time.Hour, 60 * 24 * time.Hour, 400 * 24 * time.Hour,
		}
		evIDs := make([]string, len(ages))
		for i, age := range ages {
			evIDs[i] = uuid.NewString()
			if _, err := f.Inbox.Process(ctx, "c1", evIDs[i], func(ctx context.Context) error { return f.Effect(ctx, evIDs[i]) }); err != nil {
				t.Fatalf("Process: %v", err)
			}
			if age > 0 {
				if err := f.Backdate(ctx, "c1", evIDs[i], age); err != nil {
					t.Fatalf("Backdate: %v", err)
				}
			}
		}
		var progress []int64
		n, err := inbox.Cleanup(ctx, f.Cleaner, inbox.CleanupOptions{BatchSize: 3, OnProgress: func(d int64) { progress = append(progress, d) }})
		if err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
		if n != 4 {
			t.Errorf("Cleanup deleted %d records, want the 4 older than %v", n, inbox.DefaultRetention)
		}
		if fmt.Sprint(progress) != "[3 4]" {
			t.Errorf("Cleanup progress %v, want [3 4] (batches of 3)", progress)
		}
		for i, id := range evIDs {
			inboxWantProcessed(t, f, "c1", id, ages[i] < inbox.DefaultRetention)
		}
		// A shorter window deletes the 40-day-old record too.
		if n, err := inbox.Cleanup(ctx, f.Cleaner, inbox.CleanupOptions{Retention: 35 * 24 * time.Hour}); err != nil || n != 1 {
			t.Errorf("Cleanup(35 days) = (%d, %v), want (1, nil)", n, err)
		}
		inboxWantProcessed(t, f, "c1", evIDs[0], true)
	})
}

type inboxOutcome struct {
	id        string
	processed bool
	ran       bool
	err       error
}

// inboxRaceFirstHolds runs a first delivery whose handler holds its
// transaction open for inboxHold and then returns firstErr, and a second
// delivery of the same event that starts while the first holds. It checks
// that the second did not finish before the first ended: it waited on the
// first's uncommitted record (PostgreSQL: the unique index entry; SQLite:
// the write lock) instead of racing past it.
func inboxRaceFirstHolds(t *testing.T, f *InboxFixture, firstErr error) (first, second inboxOutcome) {
	t.Helper()
	ctx := wait.Context(t, "the deliveries", f.timeout(t), func() any { return nil })
	id := uuid.NewString()
	first.id, second.id = id, id
	inside := make(chan struct{})
	var firstEnded atomic.Int64 // unix nanos when the first handler returned
	done1 := make(chan struct{})
	go func() {
		defer close(done1)
		first.processed, first.err = f.Inbox.Process(ctx, "c1", id, func(ctx context.Context) error {
			first.ran = true
			if err := f.Effect(ctx, id); err != nil {
				return err
			}
			close(inside)
			time.Sleep(inboxHold)
			firstEnded.Store(time.Now().UnixNano())
			return firstErr
		})
	}()
	select {
	case <-inside:
	case <-done1:
		t.Fatalf("first delivery ended before its handler held: (%v, %v)", first.processed, first.err)
	}
	started := time.Now()
	second.processed, second.err = f.Inbox.Process(ctx, "c1", id, func(ctx context.Context) error {
		second.ran = true
		return f.Effect(ctx, id)
	})
	secondEnded := time.Now()
	<-done1
	if end := firstEnded.Load(); end == 0 || secondEnded.UnixNano() < end {
		t.Fatalf("second delivery returned after %v, before the first's handler ended: it did not wait for the first transaction", secondEnded.Sub(started))
	}
	t.Logf("second delivery waited %v for the first transaction", secondEnded.Sub(started).Round(time.Millisecond))
	return first, second
}

func inboxWantEffects(t *testing.T, f *InboxFixture, want map[string]int) {
	t.Helper()
	got, err := f.Effects(t.Context())
	if err != nil {
		t.Fatalf("Effects: %v", err)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("effect %q happened %d times, want %d", k, got[k], n)
		}
	}
	for k, n := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected effect %q happened %d times", k, n)
		}
	}
}

func inboxWantProcessed(t *testing.T, f *InboxFixture, consumer, id string, want bool) {
	t.Helper()
	got, err := f.Processed(t.Context(), consumer, id)
	if err != nil {
		t.Fatalf("Processed: %v", err)
	}
	if got != want {
		t.Errorf("record (%s, %s) present = %v, want %v", consumer, id, got, want)
	}
}
