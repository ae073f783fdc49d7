package sqlxoutbox_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
)

// With DeleteOnPublish a commit deletes the published events' rows and
// records failures as without it; released and unmentioned events stay
// untouched, and open claims stay disjoint.
func TestDeleteOnPublish(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, b, sqlxoutbox.Options{DeleteOnPublish: true})
			evs := e.enqueue(t, true, events(6, "x", 1)...)

			a, other := e.claim(t, 3), e.claim(t, 100)
			if !slices.Equal(seqsOf(a.Events()), seqsOf(evs[:3])) || !slices.Equal(seqsOf(other.Events()), seqsOf(evs[3:])) {
				t.Fatalf("claims %v and %v overlap or miss events", seqsOf(a.Events()), seqsOf(other.Events()))
			}
			// A claim that ends without an outcome (a relay that died
			// before its commit) deletes nothing.
			if err := other.Release(ctx); err != nil {
				t.Fatal(err)
			}
			out := core.Outcome{
				Published: []int64{evs[0].Seq},
				Failed:    []core.Failure{{Seq: evs[1].Seq, Err: "broker said no", RetryIn: time.Hour}},
			} // evs[2] unmentioned
			if err := a.Commit(ctx, out); err != nil {
				t.Fatal(err)
			}
			if _, err := e.box.Get(ctx, evs[0].ID); !errors.Is(err, core.ErrEventNotFound) {
				t.Errorf("published event: Get = %v, want ErrEventNotFound (deleted)", err)
			}
			if got := e.get(t, evs[1].ID); got.AttemptCount != 1 || got.LastError != "broker said no" || got.PublishedAt != nil {
				t.Errorf("failed event: %+v, want kept with its attempt and error", got)
			}
			for _, ev := range evs[2:] {
				if got := e.get(t, ev.ID); got.AttemptCount != 0 || got.PublishedAt != nil {
					t.Errorf("unmentioned or released event changed: %+v", got)
				}
			}

			// A dead letter is kept; the rest is published and deleted.
			c := e.claim(t, 100)
			if got := seqsOf(c.Events()); !slices.Equal(got, seqsOf(evs[2:])) {
				t.Fatalf("claimed %v, want %v", got, seqsOf(evs[2:]))
			}
			out = core.Outcome{Published: seqsOf(evs[3:]), Failed: []core.Failure{{Seq: evs[2].Seq, Err: "poison", Dead: true}}}
			if err := c.Commit(ctx, out); err != nil {
				t.Fatal(err)
			}
			if got := e.get(t, evs[2].ID); got.DeadAt == nil {
				t.Errorf("dead letter: %+v, want kept as dead", got)
			}
			if rows := e.rows(t); rows != 2 {
				t.Errorf("%d rows in the outbox, want 2 (the failed event and the dead letter)", rows)
			}
			s, err := e.box.Stats(ctx)
			if err != nil || s.Pending != 1 || s.Dead != 1 {
				t.Errorf("Stats = %+v, %v; want 1 pending, 1 dead", s, err)
			}
		})
	}
}

// An ordered relay deleting on publish keeps each aggregate's order and
// leaves no published row.
func TestDeleteOnPublishOrdered(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b, sqlxoutbox.Options{DeleteOnPublish: true})
			evs := e.enqueue(t, true, events(60, "x", 4)...)
			var got []core.Event
			pub := core.PublisherFunc(func(_ context.Context, batch []core.Event) error {
				got = append(got, batch...)
				return nil
			})
			relay, err := core.NewRelay(e.box, pub, core.RelayOptions{BatchSize: 7, Ordering: core.OrderingOn, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for range 100 {
				if _, err := relay.ProcessBatch(ctx); err != nil {
					t.Fatal(err)
				}
				if len(got) >= len(evs) {
					break
				}
			}
			if len(got) != len(evs) {
				t.Fatalf("published %d of %d events", len(got), len(evs))
			}
			last := map[string]int64{}
			for _, ev := range got {
				if ev.Seq <= last[ev.AggregateID] {
					t.Errorf("aggregate %s: event %d published after %d", ev.AggregateID, ev.Seq, last[ev.AggregateID])
				}
				last[ev.AggregateID] = ev.Seq
			}
			if rows := e.rows(t); rows != 0 {
				t.Errorf("%d rows left in the outbox, want none", rows)
			}
		})
	}
}
