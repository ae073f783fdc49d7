package core

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// orderedMemStore is a memStore that also serves ordered claims, with the
// semantics the SQL stores implement: partitions by hash of the aggregate,
// one open claim per partition, and an event held back by an earlier
// unpublished event of its aggregate that is not claimable now.
type orderedMemStore struct {
	*memStore
	locked map[int]bool // partitions held by open claims
}

func newOrderedMemStore() *orderedMemStore {
	return &orderedMemStore{memStore: newMemStore(), locked: map[int]bool{}}
}

func (s *orderedMemStore) OrderedClaims() bool { return true }

func memPartition(ev *Event, n int) int {
	if ev.AggregateID == "" {
		return int(ev.Seq % int64(n))
	}
	h := fnv.New32a()
	h.Write([]byte(ev.AggregateID))
	return int(h.Sum32() % uint32(n))
}

func (s *orderedMemStore) Claim(ctx context.Context, req ClaimRequest) (Claim, error) {
	if req.Ordered == nil {
		return s.memStore.Claim(ctx, req)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o := req.Ordered
	var parts []int
	for _, p := range o.Partitions {
		if !s.locked[p] {
			s.locked[p] = true
			parts = append(parts, p)
		}
	}
	now := s.now()
	blocks := func(e *Event) bool {
		if e.PublishedAt != nil {
			return false
		}
		if e.DeadAt != nil {
			return o.DeadLetter == DeadLetterBlock
		}
		return e.NextAttemptAt.After(now)
	}
	var out []Event
	for i, e := range s.events {
		if len(out) == req.Limit {
			break
		}
		if e.PublishedAt != nil || e.DeadAt != nil || s.held[e.Seq] || e.NextAttemptAt.After(now) ||
			!slices.Contains(parts, memPartition(e, o.PartitionCount)) {
			continue
		}
		ok := true
		for _, prev := range s.events[:i] {
			if e.AggregateID != "" && prev.AggregateID == e.AggregateID && blocks(prev) {
				ok = false
				break
			}
		}
		if ok {
			s.held[e.Seq] = true
			out = append(out, *e)
		}
	}
	return &orderedMemClaim{memClaim: &memClaim{s: s.memStore, events: out}, s: s, parts: parts}, nil
}

type orderedMemClaim struct {
	*memClaim
	s     *orderedMemStore
	parts []int
}

func (c *orderedMemClaim) unlock() {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	for _, p := range c.parts {
		delete(c.s.locked, p)
	}
}

func (c *orderedMemClaim) Commit(ctx context.Context, out Outcome) error {
	defer c.unlock()
	return c.memClaim.Commit(ctx, out)
}

func (c *orderedMemClaim) Release(ctx context.Context) error {
	defer c.unlock()
	return c.memClaim.Release(ctx)
}

// failIDs fails the events whose IDs it holds, publishing the rest to rec.
type failIDs struct {
	mu   sync.Mutex
	fail map[string]bool
	got  []Event
}

func (f *failIDs) Publish(ctx context.Context, events []Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	be := NewBatchError(len(events))
	for i, ev := range events {
		if f.fail[ev.ID] {
			be.Errs[i] = errors.New("refused")
			continue
		}
		f.got = append(f.got, ev)
	}
	return be.ErrOrNil()
}

func (f *failIDs) published() []Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

func aggEvents(t *testing.T, s *orderedMemStore, aggs []string, perAgg int) []Event {
	t.Helper()
	for i := range perAgg {
		for _, a := range aggs {
			ev, err := NewEvent("test", a, "t", map[string]int{"n": i})
			if err != nil {
				t.Fatal(err)
			}
			s.add(ev)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Event, len(s.events))
	for i, e := range s.events {
		out[i] = *e
	}
	return out
}

func orderedRelay(t *testing.T, s Store, pub Publisher, o RelayOptions) *Relay {
	t.Helper()
	o.Ordering = OrderingOn
	if o.Logger == nil {
		o.Logger = discardLogger()
	}
	r, err := NewRelay(s, pub, o)
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
func checkOrder(t *testing.T, got []Event) {
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
	r := orderedRelay(t, s, pub, RelayOptions{BatchSize: 100, Retry: RetryPolicy{InitialBackoff: time.Hour}})

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
	s.mu.Lock()
	s.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	s.mu.Unlock()
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

func mustEvent(t *testing.T, agg string, n int) Event {
	t.Helper()
	ev, err := NewEvent("test", agg, "t", map[string]int{"n": n})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestOrderedDeadLetterPolicies(t *testing.T) {
	for _, policy := range []DeadLetterPolicy{DeadLetterBlock, DeadLetterSkip} {
		t.Run(policy.String(), func(t *testing.T) {
			s := newOrderedMemStore()
			evs := aggEvents(t, s, []string{"a", "b"}, 2) // a0 b0 a1 b1
			pub := &failIDs{fail: map[string]bool{evs[0].ID: true}}
			r := orderedRelay(t, s, pub, RelayOptions{
				Retry:   RetryPolicy{MaxAttempts: 1},
				Ordered: OrderedOptions{DeadLetter: policy},
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
			case DeadLetterBlock:
				if a1.PublishedAt != nil {
					t.Fatal("a1 published although a0 is dead and the policy blocks")
				}
			case DeadLetterSkip:
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
	pub := PublisherFunc(func(ctx context.Context, events []Event) error {
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
	r := orderedRelay(t, s, pub, RelayOptions{
		BatchSize: 30, Concurrency: 4, PollInterval: time.Millisecond,
		Retry:   RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, MaxAttempts: 1000},
		Ordered: OrderedOptions{PartitionCount: 8},
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
	PublisherFunc
	keeps bool
}

func (p orderingPub) PreservesAggregateOrder() bool { return p.keeps }

func TestOrderingModeResolution(t *testing.T) {
	nop := PublisherFunc(func(context.Context, []Event) error { return nil })
	kafkaLike := orderingPub{PublisherFunc: nop, keeps: true}
	cases := []struct {
		name    string
		store   Store
		pub     Publisher
		mode    OrderingMode
		ordered bool
		err     error
	}{
		{"auto, plain broker", newOrderedMemStore(), nop, OrderingAuto, false, nil},
		{"auto, ordering broker", newOrderedMemStore(), kafkaLike, OrderingAuto, true, nil},
		{"auto, ordering broker, store cannot", newMemStore(), kafkaLike, OrderingAuto, false, nil},
		{"on, store cannot", newMemStore(), nop, OrderingOn, false, ErrOrderedUnsupported},
		{"on", newOrderedMemStore(), nop, OrderingOn, true, nil},
		{"off, ordering broker", newOrderedMemStore(), kafkaLike, OrderingOff, false, nil},
		{"unknown mode", newOrderedMemStore(), nop, OrderingMode(9), false, ErrInvalidOptions},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := NewRelay(c.store, c.pub, RelayOptions{Ordering: c.mode, Logger: discardLogger()})
			if !errors.Is(err, c.err) {
				t.Fatalf("NewRelay error %v, want %v", err, c.err)
			}
			if err == nil && r.Ordered() != c.ordered {
				t.Fatalf("Ordered() = %v, want %v", r.Ordered(), c.ordered)
			}
		})
	}
	if _, err := NewRelay(newOrderedMemStore(), nop, RelayOptions{Ordering: OrderingOn,
		Ordered: OrderedOptions{PartitionCount: 8, Leaser: &fakeLeaser{n: 16}}}); !errors.Is(err, ErrPartitionCountMismatch) {
		t.Fatalf("PartitionCount differing from the leaser's: %v, want ErrPartitionCountMismatch", err)
	}
	if _, err := NewRelay(newOrderedMemStore(), nop, RelayOptions{Ordering: OrderingOn,
		Ordered: OrderedOptions{DeadLetter: DeadLetterPolicy(7)}}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("unknown dead-letter policy: %v, want ErrInvalidOptions", err)
	}
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

// The relay claims only from the partitions its leaser holds, runs the
// leaser, and returns the leaser's error when it cannot work.
func TestOrderedRelayUsesLeaser(t *testing.T) {
	s := newOrderedMemStore()
	evs := aggEvents(t, s, []string{"a", "b", "c", "d", "e", "f"}, 1)
	held := memPartition(&evs[0], 4)
	l := &fakeLeaser{n: 4, held: []int{held}, ran: make(chan struct{})}
	rec := &failIDs{}
	r := orderedRelay(t, s, rec, RelayOptions{Ordered: OrderedOptions{Leaser: l}, PollInterval: time.Millisecond})
	if _, err := r.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, ev := range rec.published() {
		if p := memPartition(&ev, 4); p != held {
			t.Fatalf("event of partition %d published by a relay holding only %d", p, held)
		}
	}
	if len(rec.published()) == 0 {
		t.Fatal("nothing published from the held partition")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-l.ran
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !l.closed {
		t.Fatal("Run returned before the leaser released its leases")
	}

	bad := &fakeLeaser{n: 4, err: ErrPartitionCountMismatch}
	r = orderedRelay(t, s, rec, RelayOptions{Ordered: OrderedOptions{Leaser: bad}})
	if err := r.Run(t.Context()); !errors.Is(err, ErrPartitionCountMismatch) {
		t.Fatalf("Run with a failing leaser = %v, want its error", err)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
