package outboxtest

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// Fault is a fault that RunFault injects while producers write: Inject
// starts it, Heal ends it Duration later.
type Fault struct {
	// Name names the fault in the report ("broker blackhole").
	Name string
	// Inject and Heal start and end the fault; they fail the test on
	// error.
	Inject, Heal func(t *testing.T)
	// Duration is how long the fault lasts. Default 2s.
	Duration time.Duration
}

// FaultOptions configures RunFault.
type FaultOptions struct {
	// Ordering is the relay's ordering mode (core.OrderingOn checks
	// per-aggregate order at the consumer).
	Ordering core.OrderingMode
	// Rate is how many events producers commit per second, in
	// transactions of two. Default 100.
	Rate int
	// Before and After are how long producers write before the fault and
	// after it is healed. Default 1s each.
	Before, After time.Duration
	// Relay overrides the relay's options (Ordering and Logger are set by
	// RunFault). Default: batches of 25, a 50ms poll, backoff from 100ms
	// to 1s, a 2s publish timeout.
	Relay *core.RelayOptions
	// ProducersMayFail lets producers' transactions fail during the fault
	// (a database crash): the events of a failed one count as committed
	// if the store has them once the fault is over (a commit whose answer
	// was lost), and as never written otherwise.
	ProducersMayFail bool
	// EventTypeSuffix ends the events' type, for brokers that read
	// something from it: ".fifo" makes an SNS publisher's created topics
	// FIFO topics. Default none.
	EventTypeSuffix string
	// StartConsumer, if set, starts the consumer instead of RunFault (a
	// consumer process, for faults that kill it). It must return once the
	// consumer is subscribed to topic, then apply every event it receives
	// through the InboxFixture's database, as consumer, writing the
	// fixture's effect in the inbox's transaction, until the test ends;
	// and call delivered with each message's event ID as it receives it.
	StartConsumer func(t *testing.T, topic, consumer string, delivered func(eventID string))
	// StartRelay, if set, starts the relay instead of RunFault (a relay
	// process, for faults that kill it); it must relay the store's events
	// to the broker in Ordering's mode until the test ends.
	StartRelay func(t *testing.T)
}

// FaultReport is one cell of a fault matrix.
type FaultReport struct {
	Fault string
	// Ordered reports whether the relay ran in ordered mode.
	Ordered bool
	// Committed events were written by producers; Delivered reached the
	// consumer at least once; Duplicates counts deliveries beyond the
	// first; DoubleEffects counts events whose effect the inbox let
	// through twice; Reorderings counts events first delivered before an
	// earlier event of their aggregate (ordered mode); Lost counts
	// committed events that never took effect.
	Committed, Delivered, Duplicates, DoubleEffects, Reorderings, Lost int
	// FirstDelivery is the time from the end of the fault to the first
	// delivery after it; Drained to the first delivery of the last event
	// committed before the end of the fault (the fault's backlog empty).
	FirstDelivery, Drained time.Duration
}

// String is the report as a Markdown table row.
func (r FaultReport) String() string {
	mode := "unordered"
	if r.Ordered {
		mode = "ordered"
	}
	return fmt.Sprintf("| %s | %s | %d | %d | %d | %d | %d | %d | %s | %s |", r.Fault, mode, r.Committed, r.Delivered,
		r.Duplicates, r.DoubleEffects, r.Reorderings, r.Lost, r.FirstDelivery.Round(time.Millisecond), r.Drained.Round(time.Millisecond))
}

// FaultTableHeader is the header of a table of FaultReport rows.
const FaultTableHeader = "| fault | mode | committed | delivered | duplicates | double effects | reorderings | lost | first delivery after the fault | backlog empty after the fault |\n|---|---|---|---|---|---|---|---|---|---|"

// RunFault runs the whole chain under a fault: producers commit events at
// a steady rate into newStore's outbox before, during and after the fault;
// the real core.Relay publishes them to newBroker's broker; one consumer
// takes effect through newInbox's inbox. The store's relay side and the
// broker's publisher are where the fault goes (give them handles through a
// fault proxy, e.g. package faultproxy). It fails the test when an event
// is lost, takes effect twice, or (ordered mode) is first delivered before
// an earlier event of its aggregate, and returns the cell's figures.
func RunFault(t *testing.T, newStore NewStoreFunc, newBroker NewBrokerFunc, newInbox NewInboxFunc, fault Fault, opts FaultOptions) FaultReport {
	t.Helper()
	if fault.Duration == 0 {
		fault.Duration = 2 * time.Second
	}
	if opts.Rate == 0 {
		opts.Rate = 100
	}
	if opts.Before == 0 {
		opts.Before = time.Second
	}
	if opts.After == 0 {
		opts.After = time.Second
	}
	f, b, in := newStore(t), newBroker(t), newInbox(t)
	et := uniqueType("fault") + opts.EventTypeSuffix
	consumer := "suite-fault-" + strconv.FormatInt(time.Now().UnixNano(), 36)

	var (
		mu         sync.Mutex
		deliveries = map[string]int{}
		firstAt    = map[string]time.Time{}
		order      []string // event IDs in order of first delivery
		healedAt   time.Time
		firstAfter time.Time
		beforeHeal int // events committed before the fault was healed
	)
	delivered := func(id string) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		deliveries[id]++
		if _, ok := firstAt[id]; !ok {
			firstAt[id] = now
			order = append(order, id)
		}
		if !healedAt.IsZero() && firstAfter.IsZero() {
			firstAfter = now
		}
	}
	if opts.StartConsumer != nil {
		opts.StartConsumer(t, b.topic(et), consumer, delivered)
	} else {
		count := func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				delivered(msg.Metadata.Get(core.HeaderEventID))
				out, err := h(msg)
				if err != nil {
					// A consumer whose database is down (a fault of the
					// inbox's connection) would otherwise nack and take
					// the message back in a tight loop, and every lap
					// would count as a duplicate delivery: pause before
					// the nack, as a consumer's retry backoff does.
					select {
					case <-msg.Context().Done():
					case <-time.After(100 * time.Millisecond):
					}
				}
				return out, err
			}
		}
		runInboxConsumer(t, in, consumer, testLogger(t), "fault", b.topic(et), b.Subscriber, count, func(msg *message.Message) error {
			return in.Effect(msg.Context(), msg.Metadata.Get(core.HeaderEventID))
		})
	}

	ro := core.RelayOptions{
		BatchSize: 25, PollInterval: 50 * time.Millisecond, Concurrency: 2, PublishTimeout: 2 * time.Second,
		Retry: core.RetryPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, MaxAttempts: 1000},
	}
	if opts.Relay != nil {
		ro = *opts.Relay
	}
	ro.Ordering = opts.Ordering
	ro.Logger = testLogger(t)
	ordered := opts.Ordering == core.OrderingOn
	if opts.StartRelay != nil {
		opts.StartRelay(t)
	} else {
		ordered = startRelay(t, f, b.Publisher, ro).Ordered()
	}

	// Producers: two events a transaction over three aggregates, at the
	// rate, on a goroutine of their own (a fault may hold them up), until
	// the fault has been healed for After.
	var committed, uncertain []core.Event
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(time.Second / time.Duration(max(opts.Rate/2, 1)))
		defer tick.Stop()
		for n := 0; ; {
			evs := suiteEvents(t, et, 2, 1)
			for i := range evs {
				evs[i].AggregateID = "agg-" + strconv.Itoa(n%3)
				evs[i].Payload = []byte(`{"n":` + strconv.Itoa(n) + `}`)
				n++
			}
			// Longer than the fault: a producer may wait for it (an
			// exhausted pool) rather than fail, and then for a busy
			// machine: the stall limit after it.
			ctx, cancel := context.WithTimeout(context.Background(), fault.Duration+wait.Stall)
			err := f.Enqueue(ctx, evs, true)
			cancel()
			mu.Lock()
			switch {
			case err == nil:
				committed = append(committed, evs...)
			case opts.ProducersMayFail:
				uncertain = append(uncertain, evs...)
			default:
				mu.Unlock()
				t.Errorf("%s: a producer failed: %v", fault.Name, err)
				return
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }); <-stopped }
	t.Cleanup(halt) // when a fault's Inject or Heal fails the test
	time.Sleep(opts.Before)
	fault.Inject(t)
	time.Sleep(fault.Duration)
	fault.Heal(t)
	mu.Lock()
	healedAt = time.Now()
	beforeHeal = len(committed)
	mu.Unlock()
	time.Sleep(opts.After)
	halt()
	mu.Lock()
	committed = committed[:len(committed):len(committed)]
	mu.Unlock()
	// A failed commit may have committed: the store says.
	for _, ev := range uncertain {
		if got, err := f.Get(t.Context(), ev.ID); err == nil {
			ev.Seq = got.Seq
			committed = append(committed, ev)
		}
	}
	if len(uncertain) > 0 {
		// In the order they were written (one producer: Seq order).
		sort.SliceStable(committed, func(i, j int) bool { return committed[i].Seq < committed[j].Seq })
	}

	// The fault's backlog drains at the relay's pace, for as long as
	// deliveries keep coming.
	ctx := wait.Context(t, "deliveries", b.deliveryTimeout(t), func() any {
		mu.Lock()
		defer mu.Unlock()
		return len(firstAt)
	})
	if missing := awaitEffects(t, ctx, in, committed, b.deliveryTimeout(t)); missing > 0 {
		t.Errorf("%s: %d of %d committed events never took effect", fault.Name, missing, len(committed))
	}
	// Let redeliveries in flight land before counting effects.
	time.Sleep(500 * time.Millisecond)
	effects, err := in.Effects(context.Background())
	if err != nil {
		t.Fatalf("Effects: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	rep := FaultReport{Fault: fault.Name, Ordered: ordered, Committed: len(committed), Delivered: len(firstAt)}
	// The backlog of the fault is empty when the last event committed
	// before the heal has been delivered.
	for _, ev := range committed[:beforeHeal] {
		if at, ok := firstAt[ev.ID]; ok && at.Sub(healedAt) > rep.Drained {
			rep.Drained = at.Sub(healedAt)
		}
	}
	if !firstAfter.IsZero() {
		rep.FirstDelivery = firstAfter.Sub(healedAt)
	}
	for _, c := range deliveries {
		rep.Duplicates += c - 1
	}
	seq := map[string]int{}
	for i, ev := range committed {
		seq[ev.ID] = i
		switch effects[ev.ID] {
		case 0:
			rep.Lost++
		case 1:
		default:
			rep.DoubleEffects++
		}
	}
	if rep.Ordered {
		aggOf := map[string]string{}
		for _, ev := range committed {
			aggOf[ev.ID] = ev.AggregateID
		}
		last := map[string]int{}
		for _, id := range order {
			agg := aggOf[id]
			if prev, ok := last[agg]; ok && seq[id] < prev {
				rep.Reorderings++
				continue
			}
			last[agg] = seq[id]
		}
	}
	if rep.Lost != 0 || rep.DoubleEffects != 0 || rep.Reorderings != 0 {
		t.Errorf("%s: %d lost, %d double effects, %d reorderings; want none", fault.Name, rep.Lost, rep.DoubleEffects, rep.Reorderings)
	}
	t.Log(rep)
	return rep
}
