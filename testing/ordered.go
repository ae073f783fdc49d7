package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// RunOrderedStore proves the ordered claims of a store whose Capabilities
// report OrderedClaims (see core.OrderedClaim): an ordered claim returns
// its events in Seq order; an event in backoff holds back the later events
// of its own aggregate and of no other, while unordered claims are not held
// back; a dead event holds its aggregate back under core.DeadLetterBlock
// and not under core.DeadLetterSkip, and re-queued it comes first again;
// two open ordered claims never serve one aggregate; a claim of some
// partitions returns theirs only, and an aggregate lives in one partition;
// bad requests and outcomes are refused. Run it in addition to RunStore.
func RunOrderedStore(t *testing.T, newStore NewStoreFunc) {
	t.Run("FailureBlocksOnlyItsAggregate", func(t *testing.T) {
		t.Parallel()
		f := newOrderedFixture(t, newStore)
		evs := orderedEnqueue(t, f, []string{"a", "b"}, 3) // a0 b0 a1 b1 a2 b2
		a0, b0, a1, b1, a2, b2 := evs[0], evs[1], evs[2], evs[3], evs[4], evs[5]
		req := core.ClaimRequest{Limit: 100, Ordered: &core.OrderedClaim{PartitionCount: 8}}

		c := mustClaimReq(t, f, req)
		if got := seqsOf(c.Events()); !slices.Equal(got, seqsOf(evs)) {
			t.Fatalf("first claim %v, want all in Seq order %v", got, seqsOf(evs))
		}
		// a0 fails; a1 and a2 are left out of the outcome.
		mustCommit(t, c, core.Outcome{
			Published: []int64{b0.Seq, b1.Seq},
			Failed:    []core.Failure{{Seq: a0.Seq, Err: "refused", RetryIn: time.Hour}},
		})
		c = mustClaimReq(t, f, req)
		if got := seqsOf(c.Events()); !slices.Equal(got, []int64{b2.Seq}) {
			t.Fatalf("claim with a0 in backoff = %v, want only b2 (%d); a1=%d a2=%d", got, b2.Seq, a1.Seq, a2.Seq)
		}
		mustCommit(t, c, core.Outcome{Published: []int64{b2.Seq}})
		// The unordered claim of the same store is not held back.
		c = mustClaimReq(t, f, core.ClaimRequest{Limit: 100})
		if got := seqsOf(c.Events()); !slices.Equal(sorted(got), []int64{a1.Seq, a2.Seq}) {
			t.Fatalf("unordered claim = %v, want a1, a2", got)
		}
		mustRelease(t, c)
		// a0's backoff ends: the whole aggregate follows, in order.
		if err := f.Backdate(t.Context(), a0.ID, 2*time.Hour); err != nil {
			t.Fatal(err)
		}
		c = mustClaimReq(t, f, req)
		if got := seqsOf(c.Events()); !slices.Equal(got, []int64{a0.Seq, a1.Seq, a2.Seq}) {
			t.Fatalf("claim after the backoff = %v, want a0, a1, a2", got)
		}
		mustRelease(t, c)
	})

	// A scheduled event holds nothing back: its aggregate's later events
	// go out now, and it takes its place in the order at its time.
	t.Run("ScheduledEventHoldsNothingBack", func(t *testing.T) {
		t.Parallel()
		f := newOrderedFixture(t, newStore)
		et := uniqueType("ordered")
		var evs []core.Event
		for i := range 3 {
			ev, err := core.NewEvent("suite", "a", et, map[string]any{"n": i})
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
		}
		evs[0].NotBefore = time.Now().Add(time.Hour)
		mustEnqueue(t, f, evs, true)
		for i := range evs {
			evs[i].Seq = mustGet(t, f, evs[i].ID).Seq
		}
		req := core.ClaimRequest{Limit: 100, Ordered: &core.OrderedClaim{PartitionCount: 8}}
		c := mustClaimReq(t, f, req)
		if got := seqsOf(c.Events()); !slices.Equal(got, []int64{evs[1].Seq, evs[2].Seq}) {
			t.Fatalf("ordered claim with a0 scheduled an hour ahead = %v, want a1, a2 (%v)", got, seqsOf(evs[1:]))
		}
		mustCommit(t, c, core.Outcome{Published: []int64{evs[1].Seq, evs[2].Seq}})
		if err := f.Backdate(t.Context(), evs[0].ID, 2*time.Hour); err != nil {
			t.Fatal(err)
		}
		c = mustClaimReq(t, f, req)
		if got := seqsOf(c.Events()); !slices.Equal(got, []int64{evs[0].Seq}) {
			t.Fatalf("ordered claim once a0 fell due = %v, want a0 (%d)", got, evs[0].Seq)
		}
		mustRelease(t, c)
	})

	for _, policy := range []core.DeadLetterPolicy{core.DeadLetterBlock, core.DeadLetterSkip} {
		t.Run("DeadLetter"+map[core.DeadLetterPolicy]string{core.DeadLetterBlock: "Block", core.DeadLetterSkip: "Skip"}[policy], func(t *testing.T) {
			t.Parallel()
			f := newOrderedFixture(t, newStore)
			if f.RetryDead == nil {
				t.Fatal("StoreFixture needs RetryDead for RunOrderedStore")
			}
			evs := orderedEnqueue(t, f, []string{"a", "b"}, 2) // a0 b0 a1 b1
			a0, b0, a1, b1 := evs[0], evs[1], evs[2], evs[3]
			req := core.ClaimRequest{Limit: 100, Ordered: &core.OrderedClaim{PartitionCount: 8, DeadLetter: policy}}
			mustCommit(t, mustClaimReq(t, f, req), core.Outcome{
				Published: []int64{b0.Seq, b1.Seq},
				Failed:    []core.Failure{{Seq: a0.Seq, Err: "poison", Dead: true}},
			})
			c := mustClaimReq(t, f, req)
			got := seqsOf(c.Events())
			switch policy {
			case core.DeadLetterBlock:
				if len(got) != 0 {
					t.Fatalf("claim behind a dead event = %v, want nothing under block", got)
				}
			case core.DeadLetterSkip:
				if !slices.Equal(got, []int64{a1.Seq}) {
					t.Fatalf("claim behind a dead event = %v, want a1 under skip", got)
				}
			}
			mustRelease(t, c)
			// Re-queued, the dead event comes first again.
			if err := f.RetryDead(t.Context(), a0.ID); err != nil {
				t.Fatal(err)
			}
			c = mustClaimReq(t, f, req)
			if got := seqsOf(c.Events()); !slices.Equal(got, []int64{a0.Seq, a1.Seq}) {
				t.Fatalf("claim after re-queueing = %v, want a0, a1", got)
			}
			mustRelease(t, c)
		})
	}

	t.Run("NeverServesAnAggregateTwice", func(t *testing.T) {
		t.Parallel()
		f := newOrderedFixture(t, newStore)
		orderedEnqueue(t, f, aggregateNames(20), 5)
		req := core.ClaimRequest{Limit: 30, Ordered: &core.OrderedClaim{PartitionCount: 4}}
		first := mustClaimReq(t, f, req)
		if len(first.Events()) != 30 {
			t.Fatalf("first claim has %d events, want 30", len(first.Events()))
		}
		second := mustClaimReq(t, f, req)
		firstAggs := map[string]bool{}
		for _, ev := range first.Events() {
			firstAggs[ev.AggregateID] = true
		}
		for _, ev := range second.Events() {
			if firstAggs[ev.AggregateID] {
				t.Fatalf("aggregate %s served by two open claims", ev.AggregateID)
			}
		}
		mustRelease(t, second)
		mustCommit(t, first, core.Outcome{Published: seqsOf(first.Events())})
		third := mustClaimReq(t, f, req)
		if len(third.Events()) == 0 {
			t.Fatal("nothing claimable after the first claim committed")
		}
		mustRelease(t, third)
	})

	t.Run("OnlyRequestedPartitions", func(t *testing.T) {
		t.Parallel()
		f := newOrderedFixture(t, newStore)
		evs := orderedEnqueue(t, f, aggregateNames(40), 3)
		const n = 8
		some := []int{1, 4, 6}
		rest := []int{0, 2, 3, 5, 7}
		if !f.Store.Capabilities().OrderedPartitions {
			_, err := f.Store.Claim(t.Context(), core.ClaimRequest{Limit: 10, Ordered: &core.OrderedClaim{Partitions: some, PartitionCount: n}})
			if !errors.Is(err, core.ErrUnsupported) {
				t.Fatalf("ordered claim of some partitions on a store without OrderedPartitions = %v, want ErrUnsupported", err)
			}
			return
		}
		a := mustClaimReq(t, f, core.ClaimRequest{Limit: 1000, Ordered: &core.OrderedClaim{Partitions: some, PartitionCount: n}})
		b := mustClaimReq(t, f, core.ClaimRequest{Limit: 1000, Ordered: &core.OrderedClaim{Partitions: rest, PartitionCount: n}})
		if len(a.Events()) == 0 || len(b.Events()) == 0 {
			t.Fatalf("claims of partitions %v and %v got %d and %d events; 40 aggregates should reach both", some, rest, len(a.Events()), len(b.Events()))
		}
		if len(a.Events())+len(b.Events()) != len(evs) {
			t.Fatalf("claims of complementary partitions got %d + %d events, want all %d", len(a.Events()), len(b.Events()), len(evs))
		}
		inA := map[string]bool{}
		for _, ev := range a.Events() {
			inA[ev.AggregateID] = true
		}
		for _, ev := range b.Events() {
			if inA[ev.AggregateID] {
				t.Fatalf("aggregate %s is in two partitions", ev.AggregateID)
			}
		}
		mustRelease(t, a)
		mustRelease(t, b)
	})

	t.Run("RejectsBadRequests", func(t *testing.T) {
		t.Parallel()
		f := newOrderedFixture(t, newStore)
		if _, err := f.Store.Claim(t.Context(), core.ClaimRequest{}); !errors.Is(err, core.ErrInvalidOptions) {
			t.Fatalf("Claim with no limit = %v, want ErrInvalidOptions", err)
		}
		if _, err := f.Store.Claim(t.Context(), core.ClaimRequest{Limit: 1, Ordered: &core.OrderedClaim{}}); !errors.Is(err, core.ErrInvalidOptions) {
			t.Fatalf("ordered Claim with no partition count = %v, want ErrInvalidOptions", err)
		}
		orderedEnqueue(t, f, []string{"a"}, 1)
		c := mustClaimReq(t, f, core.ClaimRequest{Limit: 1, Ordered: &core.OrderedClaim{PartitionCount: 4}})
		if err := c.Commit(t.Context(), core.Outcome{Published: []int64{-12345}}); !errors.Is(err, core.ErrInvalidOutcome) {
			t.Fatalf("Commit of an event not in the claim = %v, want ErrInvalidOutcome", err)
		}
		if err := c.Commit(t.Context(), core.Outcome{}); !errors.Is(err, core.ErrClaimDone) {
			t.Fatalf("second Commit = %v, want ErrClaimDone", err)
		}
	})
}

func newOrderedFixture(t *testing.T, newStore NewStoreFunc) *StoreFixture {
	t.Helper()
	f := newStore(t)
	if !f.Store.Capabilities().OrderedClaims {
		t.Fatal("RunOrderedStore: the store's Capabilities do not report OrderedClaims")
	}
	if f.Backdate == nil {
		t.Fatal("StoreFixture needs Backdate")
	}
	return f
}

// orderedEnqueue commits perAgg events for each aggregate, interleaved (a0
// b0 a1 b1 ...), and returns them with their Seq.
func orderedEnqueue(t *testing.T, f *StoreFixture, aggs []string, perAgg int) []core.Event {
	t.Helper()
	var evs []core.Event
	et := uniqueType("ordered")
	for i := range perAgg {
		for _, a := range aggs {
			ev, err := core.NewEvent("suite", a, et, map[string]any{"agg": a, "n": i})
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
		}
	}
	mustEnqueue(t, f, evs, true)
	for i := range evs {
		evs[i].Seq = mustGet(t, f, evs[i].ID).Seq
	}
	if !slices.IsSortedFunc(evs, func(a, b core.Event) int { return int(a.Seq - b.Seq) }) {
		t.Fatalf("the store's Seq does not follow the order of one transaction's events: %v", seqsOf(evs))
	}
	return evs
}

func aggregateNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("agg-%d", i)
	}
	return out
}

func seqsOf(evs []core.Event) []int64 {
	out := make([]int64, len(evs))
	for i, ev := range evs {
		out[i] = ev.Seq
	}
	return out
}

func sorted(s []int64) []int64 {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func mustClaimReq(t *testing.T, f *StoreFixture, req core.ClaimRequest) core.Claim {
	t.Helper()
	c, err := f.Store.Claim(t.Context(), req)
	if err != nil {
		t.Fatalf("Claim(%+v): %v", req, err)
	}
	t.Cleanup(func() { _ = c.Release(context.Background()) })
	return c
}

func mustCommit(t *testing.T, c core.Claim, out core.Outcome) {
	t.Helper()
	if err := c.Commit(t.Context(), out); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func mustRelease(t *testing.T, c core.Claim) {
	t.Helper()
	if err := c.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}
