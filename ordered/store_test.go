package ordered_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

var dialects = []dialect.Dialect{dialect.Postgres, dialect.SQLite}

// A failing event in backoff holds back the later events of its own
// aggregate, and of no other.
func TestOrderedClaimFailureBlocksOnlyItsAggregate(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.Name(), func(t *testing.T) {
			t.Parallel()
			db := migrated(t, d)
			s := newStore(t, db, d)
			evs := enqueue(t, db, d, events([]string{"a", "b"}, 3)) // a0 b0 a1 b1 a2 b2
			a0, b0, a1, b1, a2, b2 := evs[0], evs[1], evs[2], evs[3], evs[4], evs[5]
			req := core.ClaimRequest{Limit: 100, Ordered: allOrdered(8, core.DeadLetterBlock)}

			c := claim(t, s, req)
			if got := seqsOf(c.Events()); !slices.Equal(got, seqsOf(evs)) {
				t.Fatalf("first claim %v, want all in Seq order %v", got, seqsOf(evs))
			}
			// a0 fails; a1 and a2 are left out of the outcome.
			if err := c.Commit(context.Background(), core.Outcome{
				Published: []int64{b0.Seq, b1.Seq},
				Failed:    []core.Failure{{Seq: a0.Seq, Err: "refused", RetryIn: time.Hour}},
			}); err != nil {
				t.Fatal(err)
			}
			c = claim(t, s, req)
			if got := seqsOf(c.Events()); !slices.Equal(got, []int64{b2.Seq}) {
				t.Fatalf("claim with a0 in backoff = %v, want only b2 (%d); a1=%d a2=%d", got, b2.Seq, a1.Seq, a2.Seq)
			}
			if err := c.Commit(context.Background(), core.Outcome{Published: []int64{b2.Seq}}); err != nil {
				t.Fatal(err)
			}
			// The unordered claim of the same store is not held back.
			c = claim(t, s, core.ClaimRequest{Limit: 100})
			if got := seqsOf(c.Events()); !slices.Equal(got, []int64{a1.Seq, a2.Seq}) {
				t.Fatalf("unordered claim = %v, want a1, a2", got)
			}
			if err := c.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			// a0 due again: the whole aggregate follows, in order.
			backdate(t, db, d, a0.Seq)
			c = claim(t, s, req)
			if got := seqsOf(c.Events()); !slices.Equal(got, []int64{a0.Seq, a1.Seq, a2.Seq}) {
				t.Fatalf("claim after the backoff = %v, want a0, a1, a2", got)
			}
			if err := c.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// backdate makes the event at seq due now.
func backdate(t testing.TB, db *sql.DB, d dialect.Dialect, seq int64) {
	t.Helper()
	query := "UPDATE outbox_events SET next_attempt_at = now() - interval '1 second' WHERE id = $1"
	if d == dialect.SQLite {
		query = "UPDATE outbox_events SET next_attempt_at = strftime('%Y-%m-%dT%H:%M:%fZ','now','-1 seconds') WHERE id = ?"
	}
	if _, err := db.ExecContext(context.Background(), query, seq); err != nil {
		t.Fatal(err)
	}
}

func TestOrderedClaimDeadLetterPolicies(t *testing.T) {
	for _, d := range dialects {
		for _, policy := range []core.DeadLetterPolicy{core.DeadLetterBlock, core.DeadLetterSkip} {
			t.Run(d.Name()+"/"+policy.String(), func(t *testing.T) {
				t.Parallel()
				db := migrated(t, d)
				s := newStore(t, db, d)
				evs := enqueue(t, db, d, events([]string{"a", "b"}, 2)) // a0 b0 a1 b1
				a0, b0, a1, b1 := evs[0], evs[1], evs[2], evs[3]
				req := core.ClaimRequest{Limit: 100, Ordered: allOrdered(8, policy)}
				c := claim(t, s, req)
				if err := c.Commit(context.Background(), core.Outcome{
					Published: []int64{b0.Seq, b1.Seq},
					Failed:    []core.Failure{{Seq: a0.Seq, Err: "poison", Dead: true}},
				}); err != nil {
					t.Fatal(err)
				}
				c = claim(t, s, req)
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
				if err := c.Release(context.Background()); err != nil {
					t.Fatal(err)
				}
				// Re-queued, the dead event comes first again.
				q := newStore(t, db, d).Queries()
				query, args, err := q.RetryDead(dialect.DeadFilter{Seqs: []int64{a0.Seq}})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := db.ExecContext(context.Background(), query, args...); err != nil {
					t.Fatal(err)
				}
				c = claim(t, s, req)
				if got := seqsOf(c.Events()); !slices.Equal(got, []int64{a0.Seq, a1.Seq}) {
					t.Fatalf("claim after re-queueing = %v, want a0, a1", got)
				}
				if err := c.Release(context.Background()); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// An event under another open claim holds its aggregate back on SQLite; on
// PostgreSQL the partition itself is held by the open claim.
func TestOrderedClaimNeverServesAPartitionTwice(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.Name(), func(t *testing.T) {
			t.Parallel()
			db := migrated(t, d)
			s := newStore(t, db, d)
			enqueue(t, db, d, events(aggNames(20), 5))
			req := core.ClaimRequest{Limit: 30, Ordered: allOrdered(4, core.DeadLetterBlock)}
			first := claim(t, s, req)
			if len(first.Events()) != 30 {
				t.Fatalf("first claim has %d events, want 30", len(first.Events()))
			}
			second := claim(t, s, req)
			firstAggs := map[string]bool{}
			for _, ev := range first.Events() {
				firstAggs[ev.AggregateID] = true
			}
			for _, ev := range second.Events() {
				if firstAggs[ev.AggregateID] {
					t.Fatalf("aggregate %s served by two open claims", ev.AggregateID)
				}
			}
			if d == dialect.Postgres && len(second.Events()) != 0 {
				t.Fatalf("second claim of the same partitions got %d events, want 0 while the first is open", len(second.Events()))
			}
			if err := second.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := first.Commit(context.Background(), core.Outcome{Published: seqsOf(first.Events())}); err != nil {
				t.Fatal(err)
			}
			third := claim(t, s, req)
			if len(third.Events()) == 0 {
				t.Fatal("nothing claimable after the first claim committed")
			}
			if err := third.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A claim of some partitions returns only their events, as PartitionOf
// computes them.
func TestOrderedClaimOnlyRequestedPartitions(t *testing.T) {
	d := dialect.Postgres
	db := migrated(t, d)
	s := newStore(t, db, d)
	evs := events(aggNames(40), 3)
	evs = append(evs, core.Event{EventType: "no.aggregate"}, core.Event{EventType: "no.aggregate"})
	evs = enqueue(t, db, d, evs)
	const n = 8
	part := map[int64]int{}
	for _, ev := range evs {
		query, args, err := s.Queries().PartitionOf(ev.Seq, n)
		if err != nil {
			t.Fatal(err)
		}
		var p int
		if err := db.QueryRowContext(context.Background(), query, args...).Scan(&p); err != nil {
			t.Fatal(err)
		}
		if p < 0 || p >= n {
			t.Fatalf("partition %d out of range", p)
		}
		part[ev.Seq] = p
	}
	byAgg := map[string]int{}
	for _, ev := range evs {
		if ev.AggregateID == "" {
			continue
		}
		if p, ok := byAgg[ev.AggregateID]; ok && p != part[ev.Seq] {
			t.Fatalf("aggregate %s in partitions %d and %d", ev.AggregateID, p, part[ev.Seq])
		}
		byAgg[ev.AggregateID] = part[ev.Seq]
	}
	want := []int{1, 4, 6}
	c := claim(t, s, core.ClaimRequest{Limit: 1000, Ordered: &core.OrderedClaim{Partitions: want, PartitionCount: n}})
	defer c.Release(context.Background())
	count := 0
	for _, ev := range evs {
		if slices.Contains(want, part[ev.Seq]) {
			count++
		}
	}
	if len(c.Events()) != count || count == 0 {
		t.Fatalf("claimed %d events, want the %d of partitions %v", len(c.Events()), count, want)
	}
	for _, ev := range c.Events() {
		if !slices.Contains(want, part[ev.Seq]) {
			t.Fatalf("event %d of partition %d claimed for partitions %v", ev.Seq, part[ev.Seq], want)
		}
	}
}

func TestStoreRejectsBadRequests(t *testing.T) {
	d := dialect.SQLite
	db := migrated(t, d)
	s := newStore(t, db, d)
	if _, err := s.Claim(context.Background(), core.ClaimRequest{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Fatalf("Claim with no limit = %v, want ErrInvalidOptions", err)
	}
	if _, err := s.Claim(context.Background(), core.ClaimRequest{Limit: 1, Ordered: &core.OrderedClaim{}}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Fatalf("ordered Claim with no partition count = %v, want ErrInvalidOptions", err)
	}
	enqueue(t, db, d, events([]string{"a"}, 1))
	c := claim(t, s, core.ClaimRequest{Limit: 1, Ordered: allOrdered(4, core.DeadLetterBlock)})
	if err := c.Commit(context.Background(), core.Outcome{Published: []int64{12345}}); err == nil {
		t.Fatal("Commit of an event not in the claim succeeded")
	}
	if err := c.Commit(context.Background(), core.Outcome{}); !errors.Is(err, core.ErrClaimDone) {
		t.Fatalf("second Commit = %v, want ErrClaimDone", err)
	}
}
