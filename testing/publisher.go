package outboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txoutbox/txoutbox/core"
)

// Received is a message the suite read back from a broker.
type Received struct {
	UUID     string
	Metadata map[string]string
	Payload  []byte
}

// Collect subscribes to topic and returns a function that waits until n
// messages whose event_id is among want arrived (others are ignored), acking
// everything. It fails the test on timeout.
func Collect(t *testing.T, sub message.Subscriber, topic string) func(ctx context.Context, want map[string]bool, n int) []Received {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatalf("subscribe %q: %v", topic, err)
	}
	return func(wctx context.Context, want map[string]bool, n int) []Received {
		t.Helper()
		var got []Received
		for len(got) < n {
			select {
			case <-wctx.Done():
				t.Fatalf("topic %q: received %d of %d messages before %v", topic, len(got), n, wctx.Err())
			case m, ok := <-msgs:
				if !ok {
					t.Fatalf("topic %q: subscription closed after %d of %d messages", topic, len(got), n)
				}
				r := Received{UUID: m.UUID, Metadata: map[string]string(m.Metadata), Payload: append([]byte(nil), m.Payload...)}
				m.Ack()
				if want == nil || want[r.Metadata[core.HeaderEventID]] {
					got = append(got, r)
				}
			}
		}
		return got
	}
}

// RunPublisher proves a broker's publisher: every published event arrives
// with its payload, its own headers and the identity headers; a batch with
// several aggregates keeps each aggregate's order where the broker claims
// order; and an empty batch is a no-op.
func RunPublisher(t *testing.T, newBroker NewBrokerFunc) {
	t.Run("DeliversPayloadAndHeaders", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t)
		et := uniqueType("pub")
		wait := Collect(t, b.Subscriber, b.topic(et))
		evs := suiteEvents(t, et, 25, 5)
		ctx, cancel := timeout(t, deliveryTimeout)
		defer cancel()
		if err := b.Publisher.Publish(ctx, evs); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		byID := map[string]core.Event{}
		want := map[string]bool{}
		for _, ev := range evs {
			byID[ev.ID] = ev
			want[ev.ID] = true
		}
		got := wait(ctx, want, len(evs))
		seen := map[string]int{}
		for _, r := range got {
			id := r.Metadata[core.HeaderEventID]
			ev := byID[id]
			seen[id]++
			if err := CheckMessage(ev, r); err != nil {
				t.Error(err)
			}
		}
		for id := range want {
			if seen[id] == 0 {
				t.Errorf("event %s never arrived", id)
			}
		}
	})
	t.Run("KeepsAggregateOrder", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t)
		if !b.Ordered {
			t.Log("broker does not claim per-aggregate order; checking delivery only")
		}
		et := uniqueType("order")
		wait := Collect(t, b.Subscriber, b.topic(et))
		evs := suiteEvents(t, et, 60, 3)
		ctx, cancel := timeout(t, deliveryTimeout)
		defer cancel()
		for i := 0; i < len(evs); i += 20 {
			if err := b.Publisher.Publish(ctx, evs[i:i+20]); err != nil {
				t.Fatalf("Publish: %v", err)
			}
		}
		want := map[string]bool{}
		for _, ev := range evs {
			want[ev.ID] = true
		}
		got := wait(ctx, want, len(evs))
		if !b.Ordered {
			return
		}
		if err := CheckAggregateOrder(evs, got); err != nil {
			t.Error(err)
		}
	})
	t.Run("EmptyBatch", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t)
		if err := b.Publisher.Publish(t.Context(), nil); err != nil {
			t.Fatalf("Publish(nil) = %v, want nil", err)
		}
	})
}

// CheckMessage compares a received message with the event it carries.
func CheckMessage(ev core.Event, r Received) error {
	id := r.Metadata[core.HeaderEventID]
	if ev.ID == "" {
		return fmt.Errorf("received a message with unknown event_id %q", id)
	}
	for k, v := range ev.MessageHeaders() {
		if r.Metadata[k] != v {
			return fmt.Errorf("event %s: header %q = %q, want %q", id, k, r.Metadata[k], v)
		}
	}
	var got, want any
	if err := json.Unmarshal(r.Payload, &got); err != nil {
		return fmt.Errorf("event %s: payload %q is not JSON: %v", id, r.Payload, err)
	}
	if err := json.Unmarshal(ev.Payload, &want); err != nil {
		return fmt.Errorf("event %s: suite payload: %v", id, err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("event %s: payload %s, want %s", id, r.Payload, ev.Payload)
	}
	return nil
}

// CheckAggregateOrder checks that, for every aggregate, the first delivery
// of each event comes in the order of sent (duplicates are allowed; a later
// event before an earlier event's first delivery is not).
func CheckAggregateOrder(sent []core.Event, got []Received) error {
	pos := map[string]int{} // event id -> index among its aggregate's events
	next := map[string]int{}
	for _, ev := range sent {
		pos[ev.ID] = next[ev.AggregateID]
		next[ev.AggregateID]++
	}
	firstSeen := map[string]bool{}
	expect := map[string]int{} // aggregate -> position of the next first delivery
	for _, r := range got {
		id := r.Metadata[core.HeaderEventID]
		if firstSeen[id] {
			continue
		}
		firstSeen[id] = true
		agg := r.Metadata[core.HeaderAggregateID]
		if p := pos[id]; p != expect[agg] {
			return fmt.Errorf("aggregate %s: event #%d arrived when #%d was due", agg, p, expect[agg])
		}
		expect[agg]++
	}
	return nil
}
