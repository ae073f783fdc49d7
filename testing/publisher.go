package outboxtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// Received is a message the suite read back from a broker.
type Received struct {
	UUID     string
	Metadata map[string]string
	Payload  []byte
}

// Collection gathers the messages of one subscription, acking each.
type Collection struct {
	t     *testing.T
	topic string
	mu    sync.Mutex
	all   []Received
	count map[string]int // by event_id
	more  chan struct{}
	done  chan struct{}
}

// Collect subscribes to topic and gathers every message that arrives until
// the test ends.
func Collect(t *testing.T, sub message.Subscriber, topic string) *Collection {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		cancel()
		t.Fatalf("subscribe %q: %v", topic, err)
	}
	c := &Collection{t: t, topic: topic, count: map[string]int{}, more: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for m := range msgs {
			r := Received{UUID: m.UUID, Metadata: map[string]string(m.Metadata), Payload: append([]byte(nil), m.Payload...)}
			m.Ack()
			c.mu.Lock()
			c.all = append(c.all, r)
			c.count[r.Metadata[core.HeaderEventID]]++
			c.mu.Unlock()
			select {
			case c.more <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-c.done:
		case <-time.After(wait.Stall):
			t.Errorf("subscription to %q did not close within %v of its context's end: the subscriber ignores context cancellation", topic, wait.Stall)
		}
	})
	return c
}

// Wait waits until every event in want arrived at least once, and fails the
// test when ctx ends first. It returns everything received so far.
func (c *Collection) Wait(ctx context.Context, want []string) []Received {
	c.t.Helper()
	for {
		c.mu.Lock()
		missing := 0
		for _, id := range want {
			if c.count[id] == 0 {
				missing++
			}
		}
		noID := c.count[""]
		c.mu.Unlock()
		if missing == 0 {
			return c.All()
		}
		select {
		case <-ctx.Done():
			if noID > 0 {
				c.t.Fatalf("topic %q: %d of %d events never arrived with their event_id, and %d messages arrived without an %q header: the publisher drops headers",
					c.topic, missing, len(want), noID, core.HeaderEventID)
			}
			c.t.Fatalf("topic %q: %d of %d events never arrived (%v)", c.topic, missing, len(want), context.Cause(ctx))
		case <-c.more:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// seen is the collection's progress: how many messages arrived so far.
func (c *Collection) seen() any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.all)
}

// All returns every message received so far, in arrival order.
func (c *Collection) All() []Received {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Received(nil), c.all...)
}

// Count reports how often the event with id arrived.
func (c *Collection) Count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count[id]
}

// RunPublisher proves a broker's publisher: every published event arrives
// with its payload, its own headers and the identity headers; a batch with
// several aggregates keeps each aggregate's order where the publisher claims
// order (PublisherCapabilities.PreservesAggregateOrder); an empty batch is a
// no-op; an event the broker cannot carry fails alone, permanently, and
// never fails the good events of its batch; and a cancelled context fails
// every event of the call, leaving the publisher usable.
func RunPublisher(t *testing.T, newBroker NewBrokerFunc) {
	t.Run("DeliversPayloadAndHeaders", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t)
		et := uniqueType("pub")
		col := Collect(t, b.Subscriber, b.topic(et))
		evs := suiteEvents(t, et, 25, 5)
		ctx := wait.Context(t, "deliveries", b.deliveryTimeout(t), col.seen)
		if err := b.Publisher.Publish(ctx, evs); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		got := col.Wait(ctx, ids(evs))
		if err := CheckMessages(evs, got); err != nil {
			t.Error(err)
		}
	})
	t.Run("KeepsAggregateOrder", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t)
		ordered := b.Publisher.Capabilities().PreservesAggregateOrder
		if !ordered {
			t.Log("the publisher does not claim per-aggregate order; checking delivery only")
		}
		et := uniqueType("order")
		col := Collect(t, b.Subscriber, b.topic(et))
		evs := suiteEvents(t, et, 60, 3)
		ctx := wait.Context(t, "deliveries", b.deliveryTimeout(t), col.seen)
		for i := 0; i < len(evs); i += 20 {
			if err := b.Publisher.Publish(ctx, evs[i:i+20]); err != nil {
				t.Fatalf("Publish: %v", err)
			}
		}
		got := col.Wait(ctx, ids(evs))
		if !ordered {
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
	// One event the broker cannot carry fails alone and permanently (the
	// relay dead-letters it at once), whichever its place in the batch;
	// the good ones arrive, and the publisher stays usable.
	t.Run("PoisonInABatch", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t)
		et := uniqueType("poison")
		col := Collect(t, b.Subscriber, b.topic(et))
		evs := suiteEvents(t, et, 21, 4)
		evs[10] = b.poison(evs[10])
		ctx := wait.Context(t, "deliveries", b.deliveryTimeout(t), col.seen)
		errs := core.EventErrors(b.Publisher.Publish(ctx, evs), len(evs))
		// A publisher may hold back the later events of the poison's own
		// aggregate, to keep its order (SNS FIFO does, as the relay's
		// ordered mode would), but not for good, and no other aggregate's.
		var good []core.Event
		for i, err := range errs {
			if i == 10 {
				if !core.IsPermanent(err) {
					t.Errorf("the poison event's error = %v, want one marked core.Permanent", err)
				}
				continue
			}
			if i > 10 && evs[i].AggregateID == evs[10].AggregateID && err != nil {
				if core.IsPermanent(err) {
					t.Errorf("event %d, held back behind the poison of its aggregate, failed permanently: %v", i, err)
				}
				continue
			}
			if err != nil {
				t.Errorf("good event %d failed with the poison in its batch: %v", i, err)
			}
			good = append(good, evs[i])
		}
		got := col.Wait(ctx, ids(good))
		if n := col.Count(evs[10].ID); n != 0 {
			t.Errorf("the poison event arrived %d times", n)
		}
		if err := CheckMessages(good, got); err != nil {
			t.Error(err)
		}
		after := suiteEvents(t, et, 3, 1)
		if err := b.Publisher.Publish(ctx, after); err != nil {
			t.Fatalf("Publish after the poison: %v", err)
		}
		col.Wait(ctx, ids(after))
	})
	// The relay cancels Publish's context at its PublishTimeout and at
	// shutdown; a publisher must then report the events it did not send as
	// failed (never as published) and stay usable.
	t.Run("CancelledContext", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t)
		et := uniqueType("cancel")
		col := Collect(t, b.Subscriber, b.topic(et))
		evs := suiteEvents(t, et, 5, 2)
		cancelled, cancelNow := context.WithCancel(t.Context())
		cancelNow()
		for i, err := range core.EventErrors(b.Publisher.Publish(cancelled, evs), len(evs)) {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("event %d published with a cancelled context: error %v, want one wrapping context.Canceled", i, err)
			}
		}
		ctx := wait.Context(t, "deliveries", b.deliveryTimeout(t), col.seen)
		if err := b.Publisher.Publish(ctx, evs); err != nil {
			t.Fatalf("Publish after a cancelled one: %v", err)
		}
		col.Wait(ctx, ids(evs))
	})
}

// CheckMessages checks that every received message belongs to sent and
// carries its event faithfully.
func CheckMessages(sent []core.Event, got []Received) error {
	byID := make(map[string]core.Event, len(sent))
	for _, ev := range sent {
		byID[ev.ID] = ev
	}
	var errs []error
	for _, r := range got {
		if err := CheckMessage(byID[r.Metadata[core.HeaderEventID]], r); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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
