package core_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	memoutbox "github.com/txoutbox/txoutbox/adapters/memory"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"

	"github.com/txoutbox/txoutbox/core"
)

// The ordered tests run on the reference in-memory store, which serves
// ordered claims with the semantics of the SQL stores.
func newOrderedMemStore() *testStore { return newMemStore() }

func memPartition(ev *core.Event, n int) int { return memoutbox.Partition(ev, n) }

// failIDs fails the events whose IDs it holds, publishing the rest to rec.
type failIDs struct {
	mu   sync.Mutex
	fail map[string]bool
	got  []core.Event
}

func (f *failIDs) Publish(ctx context.Context, events []core.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	be := core.NewBatchError(len(events))
	for i, ev := range events {
		if f.fail[ev.ID] {
			be.Errs[i] = errors.New("refused")
			continue
		}
		f.got = append(f.got, ev)
	}
	return be.ErrOrNil()
}

func (*failIDs) Capabilities() core.PublisherCapabilities { return core.PublisherCapabilities{} }

func (f *failIDs) published() []core.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

func aggEvents(t *testing.T, s *testStore, aggs []string, perAgg int) []core.Event {
	t.Helper()
	for i := range perAgg {
		for _, a := range aggs {
			ev, err := core.NewEvent("test", a, "t", map[string]int{"n": i})
			if err != nil {
				t.Fatal(err)
			}
			s.add(ev)
		}
	}
	return s.Events()
}

func orderedRelay(t *testing.T, s core.Store, pub core.Publisher, o core.RelayOptions) *core.Relay {
	t.Helper()
	o.Ordering = core.OrderingOn
	if o.Logger == nil {
		o.Logger = discardLogger()
	}
	r, err := core.NewRelay(s, pub, o)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Ordered() {
		t.Fatal("relay is not ordered")
	}
	return r
}

// checkOrder fails unless every aggregate's first deliveries come in Seq
// order.
func checkOrder(t *testing.T, got []core.Event) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int64{}
	for _, ev := range got {
		if seen[ev.ID] {
			continue
		}
		seen[ev.ID] = true
		if ev.Seq < last[ev.AggregateID] {
			t.Fatalf("aggregate %s: seq %d published after %d", ev.AggregateID, ev.Seq, last[ev.AggregateID])
		}
		last[ev.AggregateID] = ev.Seq
	}
}

func TestOrderedFailureHoldsBackOnlyItsAggregate(t *testing.T) {
	s := newOrderedMemStore()
	evs := aggEvents(t, s, []string{"a", "b", "c"}, 3) // a0 b0 c0 a1 b1 c1 a2 b2 c2
	a1 := evs[3]
	pub := &failIDs{fail: map[string]bool{a1.ID: true}}
	r := orderedRelay(t, s, pub, core.RelayOptions{BatchSize: 100, Retry: core.RetryPolicy{InitialBackoff: time.Hour}})

	res, err := r.ProcessBatch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// a2 is claimed but not published: it was left out of the outcome.
	if res.Claimed != 9 || res.Published != 7 || res.Failed != 1 {
		t.Fatalf("result %+v, want 9 claimed, 7 published, 1 failed", res)
	}
	if got := s.get(evs[6].Seq); got.PublishedAt != nil || got.AttemptCount != 0 {
		t.Fatalf("a2 after a1 failed: published %v, attempts %d; want released unchanged", got.PublishedAt, got.AttemptCount)
	}
	checkOrder(t, pub.published())

	// a1 is in backoff: a2 must not be claimed, and nothing else is left.
	s.add(mustEvent(t, "b", 3), mustEvent(t, "a", 3))
	res, err = r.ProcessBatch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if res.Claimed != 1 || res.Published != 1 {
		t.Fatalf("second batch %+v, want only b3", res)
	}

	// a1's backoff ends: a1, a2, a3 follow in order.
	s.advance(2 * time.Hour)
	pub.mu.Lock()
	pub.fail = nil
	pub.mu.Unlock()
	if _, err := r.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := pub.published()
	var as []int64
	for _, ev := range got {
		if ev.AggregateID == "a" {
			as = append(as, ev.Seq)
		}
	}
	if len(as) != 4 {
		t.Fatalf("aggregate a published %v, want 4 events", as)
	}
	checkOrder(t, got)
}

func mustEvent(t *testing.T, agg string, n int) core.Event {
	t.Helper()
	ev, err := core.NewEvent("test", agg, "t", map[string]int{"n": n})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestOrderedDeadLetterPolicies(t *testing.T) {
	for _, policy := range []core.DeadLetterPolicy{core.DeadLetterBlock, core.DeadLetterSkip} {
		t.Run(policy.String(), func(t *testing.T) {
			s := newOrderedMemStore()
			evs := aggEvents(t, s, []string{"a", "b"}, 2) // a0 b0 a1 b1
			pub := &failIDs{fail: map[string]bool{evs[0].ID: true}}
			r := orderedRelay(t, s, pub, core.RelayOptions{
				Retry:   core.RetryPolicy{MaxAttempts: 1},
				Ordered: core.OrderedOptions{DeadLetter: policy},
			})
			res, err := r.ProcessBatch(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if res.DeadLettered != 1 || res.Published != 2 {
				t.Fatalf("first batch %+v, want a0 dead, b0 and b1 published", res)
			}
			if _, err := r.Drain(t.Context()); err != nil {
				t.Fatal(err)
			}
			a1 := s.get(evs[2].Seq)
			switch policy {
			case core.DeadLetterBlock:
				if a1.PublishedAt != nil {
					t.Fatal("a1 published although a0 is dead and the policy blocks")
				}
			case core.DeadLetterSkip:
				if a1.PublishedAt == nil {
					t.Fatal("a1 not published although the policy skips dead events")
				}
			}
			if s.get(evs[0].Seq).DeadAt == nil {
				t.Fatal("a0 is not recorded as dead")
			}
		})
	}
}

// Several workers and retries with random failures: every aggregate's
// events are still published in order, and all of them arrive.
func TestOrderedConcurrentWorkersRandomFailures(t *testing.T) {
	s := newOrderedMemStore()
	aggs := make([]string, 20)
	for i := range aggs {
		aggs[i] = fmt.Sprintf("agg-%d", i)
	}
	evs := aggEvents(t, s, aggs, 25)
	rng := rand.New(rand.NewPCG(1, 2))
	var mu sync.Mutex
	rec := &failIDs{}
	pub := core.PublisherFunc(func(ctx context.Context, events []core.Event) error {
		mu.Lock()
		fail := map[string]bool{}
		for _, ev := range events {
			if rng.Float64() < 0.3 {
				fail[ev.ID] = true
			}
		}
		mu.Unlock()
		rec.mu.Lock()
		rec.fail = fail
		rec.mu.Unlock()
		return rec.Publish(ctx, events)
	})
	r := orderedRelay(t, s, pub, core.RelayOptions{
		BatchSize: 30, Concurrency: 4, PollInterval: time.Millisecond,
		Retry:   core.RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, MaxAttempts: 1000},
		Ordered: core.OrderedOptions{PartitionCount: 8},
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for {
		distinct := map[string]bool{}
		for _, ev := range rec.published() {
			distinct[ev.ID] = true
		}
		if len(distinct) == len(evs) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("only %d of %d events published", len(distinct), len(evs))
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	checkOrder(t, rec.published())
	if c := r.Counters(); c.Failed == 0 {
		t.Fatal("no failure was injected; the test proves nothing")
	}
}

type orderingPub struct {
	core.PublisherFunc
	keeps bool
}

func (p orderingPub) Capabilities() core.PublisherCapabilities {
	return core.PublisherCapabilities{PreservesAggregateOrder: p.keeps}
}

// unorderedStore is a store that cannot claim in order.
type unorderedStore struct{ *testStore }

func (unorderedStore) Capabilities() core.StoreCapabilities { return core.StoreCapabilities{} }

func TestOrderingModeResolution(t *testing.T) {
	nop := core.PublisherFunc(func(context.Context, []core.Event) error { return nil })
	kafkaLike := orderingPub{PublisherFunc: nop, keeps: true}
	cases := []struct {
		name    string
		store   core.Store
		pub     core.Publisher
		mode    core.OrderingMode
		ordered bool
		err     error
	}{
		{"auto, plain broker", newOrderedMemStore(), nop, core.OrderingAuto, false, nil},
		{"auto, ordering broker", newOrderedMemStore(), kafkaLike, core.OrderingAuto, true, nil},
		// Never a quiet downgrade: the broker would keep order, the store
		// cannot, so the relay refuses to start.
		{"auto, ordering broker, store cannot", unorderedStore{newMemStore()}, kafkaLike, core.OrderingAuto, false, core.ErrOrderedUnsupported},
		{"auto, plain broker, store cannot", unorderedStore{newMemStore()}, nop, core.OrderingAuto, false, nil},
		{"on, store cannot", unorderedStore{newMemStore()}, nop, core.OrderingOn, false, core.ErrOrderedUnsupported},
		{"on", newOrderedMemStore(), nop, core.OrderingOn, true, nil},
		{"off, ordering broker", newOrderedMemStore(), kafkaLike, core.OrderingOff, false, nil},
		{"unknown mode", newOrderedMemStore(), nop, core.OrderingMode(9), false, core.ErrInvalidOptions},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := core.NewRelay(c.store, c.pub, core.RelayOptions{Ordering: c.mode, Logger: discardLogger()})
			if !errors.Is(err, c.err) {
				t.Fatalf("NewRelay error %v, want %v", err, c.err)
			}
			if err == nil && r.Ordered() != c.ordered {
				t.Fatalf("Ordered() = %v, want %v", r.Ordered(), c.ordered)
			}
		})
	}
	if _, err := core.NewRelay(newOrderedMemStore(), nop, core.RelayOptions{Ordering: core.OrderingOn,
		Ordered: core.OrderedOptions{PartitionCount: 8, Leaser: &fakeLeaser{n: 16}}}); !errors.Is(err, core.ErrPartitionCountMismatch) {
		t.Fatalf("PartitionCount differing from the leaser's: %v, want ErrPartitionCountMismatch", err)
	}
	if _, err := core.NewRelay(newOrderedMemStore(), nop, core.RelayOptions{Ordering: core.OrderingOn,
		Ordered: core.OrderedOptions{DeadLetter: core.DeadLetterPolicy(7)}}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Fatalf("unknown dead-letter policy: %v, want ErrInvalidOptions", err)
	}
}

// A worker that holds no partition yet (its leaser is still acquiring
// them) looks again soon, not after the poll interval: the leaser wakes no
// worker when it gains one, and the events committed before that, whose
// Notify found no partition, would otherwise wait a whole poll. A clean
// make test run lost three events to it for its 20 s wait.
func TestOrderedWorkerClaimsOnceTheLeaserHoldsPartitions(t *testing.T) {
	s := newOrderedMemStore()
	l := &fakeLeaser{n: 4, ran: make(chan struct{})}
	rec := &failIDs{}
	r := orderedRelay(t, s, rec, core.RelayOptions{Ordered: core.OrderedOptions{Leaser: l}, PollInterval: time.Hour})
	stop := runRelay(t, r)
	<-l.ran
	evs := aggEvents(t, s, []string{"a", "b", "c", "d"}, 1)
	r.Notify()
	time.Sleep(400 * time.Millisecond) // past the wake grace: the worker is idle
	l.mu.Lock()
	l.held = []int{0, 1, 2, 3}
	l.mu.Unlock()
	wait.Until(t, "every event once the leaser holds the partitions", func() bool { return len(rec.published()) == len(evs) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// With its partitions split among several workers, an ordered relay's
// Notify wakes every worker: one worker cannot claim another's partitions,
// so a single wake-up left the events of the others' partitions for the
// next poll (the NATS wake-up test's stranded events, with two workers).
func TestOrderedNotifyWakesEveryWorker(t *testing.T) {
	s := newOrderedMemStore()
	l := &fakeLeaser{n: 4, held: []int{0, 1, 2, 3}, ran: make(chan struct{})}
	rec := &failIDs{}
	r := orderedRelay(t, s, rec, core.RelayOptions{Ordered: core.OrderedOptions{Leaser: l}, PollInterval: time.Hour, Concurrency: 4})
	stop := runRelay(t, r)
	<-l.ran
	time.Sleep(400 * time.Millisecond) // every worker claimed nothing and is idle
	var evs []core.Event
	for _, a := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		ev, err := core.NewEvent("test", a, "t", nil)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	s.add(evs...) // one transaction: the store wakes the relay once
	parts := map[int]bool{}
	for i := range evs {
		parts[memPartition(&evs[i], 4)] = true
	}
	if len(parts) < 2 {
		t.Fatalf("the events fall in %d partition: the test needs them spread over workers", len(parts))
	}
	wait.Until(t, "every event after one wake-up", func() bool { return len(rec.published()) == len(evs) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// runRelay runs r until the returned stop is called, which ends Run and
// returns its error.
func runRelay(t *testing.T, r *core.Relay) (stop func() error) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return func() error { cancel(); return <-done }
}

type fakeLeaser struct {
	n      int
	mu     sync.Mutex
	held   []int
	err    error
	ran    chan struct{}
	closed bool
}

func (l *fakeLeaser) Owner() string       { return "fake" }
func (l *fakeLeaser) PartitionCount() int { return l.n }
func (l *fakeLeaser) Held() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.held)
}
func (l *fakeLeaser) Run(ctx context.Context) error {
	if l.ran != nil {
		close(l.ran)
	}
	if l.err != nil {
		return l.err
	}
	<-ctx.Done()
	l.mu.Lock()
	l.held, l.closed = nil, true
	l.mu.Unlock()
	return nil
}

// While Run runs, the relay claims only from the partitions its leaser
// holds; it runs the leaser, waits for it at the end, and returns the
// leaser's error when it cannot work. Outside Run (Drain) it claims from
// every partition, since no leaser is running.
func TestOrderedRelayUsesLeaser(t *testing.T) {
	s := newOrderedMemStore()
	evs := aggEvents(t, s, []string{"a", "b", "c", "d", "e", "f"}, 1)
	held := memPartition(&evs[0], 4)
	inHeld := 0
	for i := range evs {
		if memPartition(&evs[i], 4) == held {
			inHeld++
		}
	}
	l := &fakeLeaser{n: 4, held: []int{held}, ran: make(chan struct{})}
	rec := &failIDs{}
	r := orderedRelay(t, s, rec, core.RelayOptions{Ordered: core.OrderedOptions{Leaser: l}, PollInterval: time.Millisecond})
	stop := runRelay(t, r)
	<-l.ran
	wait.Until(t, "the held partition's events", func() bool { return len(rec.published()) >= inHeld })
	time.Sleep(20 * time.Millisecond) // room for a wrong claim to happen
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !l.closed {
		t.Fatal("Run returned before the leaser released its leases")
	}
	for _, ev := range rec.published() {
		if p := memPartition(&ev, 4); p != held {
			t.Fatalf("event of partition %d published by a relay holding only %d", p, held)
		}
	}
	if n := len(rec.published()); n != inHeld {
		t.Fatalf("published %d events while holding one partition, want its %d", n, inHeld)
	}
	if _, err := r.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.published()); n != len(evs) {
		t.Fatalf("Drain outside Run published %d of %d events in all, want every partition's", n, len(evs))
	}

	bad := &fakeLeaser{n: 4, err: core.ErrPartitionCountMismatch}
	r = orderedRelay(t, s, rec, core.RelayOptions{Ordered: core.OrderedOptions{Leaser: bad}})
	if err := r.Run(t.Context()); !errors.Is(err, core.ErrPartitionCountMismatch) {
		t.Fatalf("Run with a failing leaser = %v, want its error", err)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
