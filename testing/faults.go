package outboxtest

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// ErrInjected is the error of every fault that Faulty injects.
var ErrInjected = errors.New("outboxtest: injected publish failure")

// Recorder is a core.Publisher that keeps every event it is given, in
// order. It is the in-memory broker of store tests.
type Recorder struct {
	mu     sync.Mutex
	events []core.Event
	counts map[string]int
	notify chan struct{}
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{counts: map[string]int{}, notify: make(chan struct{}, 1)}
}

// Publish records events and never fails.
func (r *Recorder) Publish(ctx context.Context, events []core.Event) error {
	r.mu.Lock()
	for _, ev := range events {
		ev.Payload = slices.Clone(ev.Payload)
		r.events = append(r.events, ev)
		r.counts[ev.ID]++
	}
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
	return nil
}

// Capabilities implements core.Publisher: a Recorder keeps the order it is
// given, so it preserves aggregate order.
func (r *Recorder) Capabilities() core.PublisherCapabilities {
	return core.PublisherCapabilities{PreservesAggregateOrder: true}
}

// Events returns a copy of everything published so far, in order.
func (r *Recorder) Events() []core.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Count reports how often the event with id was published.
func (r *Recorder) Count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[id]
}

// Distinct reports how many different events were published.
func (r *Recorder) Distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.counts)
}

// Duplicates reports how many publishes repeated an event already published.
func (r *Recorder) Duplicates() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events) - len(r.counts)
}

// WaitDistinct waits until n different events were published or ctx ends.
func (r *Recorder) WaitDistinct(ctx context.Context, n int) error {
	for {
		if r.Distinct() >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.notify:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Faulty wraps a publisher and injects faults per event. Rates are
// fractions in [0, 1]; each event draws independently.
type Faulty struct {
	// Inner receives the events that get through.
	Inner core.Publisher
	// FailRate is the fraction of events refused before they are sent.
	FailRate float64
	// FailAfterSendRate is the fraction of events sent to Inner and then
	// reported as failed, as when a broker's confirm is lost: the relay
	// retries and the consumer sees a duplicate.
	FailAfterSendRate float64
	// DuplicateRate is the fraction of events sent to Inner twice.
	DuplicateRate float64
	// Delay is slept before every Publish call, honouring the context.
	Delay time.Duration
	// Seed makes the fault sequence repeatable; 0 picks a random seed.
	Seed uint64

	once                              sync.Once
	mu                                sync.Mutex
	rng                               *rand.Rand
	refused, failedAfterSend, doubled atomic.Int64
}

// FaultCounts tells how many faults a Faulty injected.
type FaultCounts struct {
	Refused         int64
	FailedAfterSend int64
	Duplicated      int64
}

// Counts returns the faults injected so far.
func (f *Faulty) Counts() FaultCounts {
	return FaultCounts{Refused: f.refused.Load(), FailedAfterSend: f.failedAfterSend.Load(), Duplicated: f.doubled.Load()}
}

func (f *Faulty) draw() float64 {
	f.once.Do(func() {
		seed := f.Seed
		if seed == 0 {
			seed = rand.Uint64()
		}
		f.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64()
}

// Capabilities implements core.Publisher: Inner's. Faults never reorder an
// aggregate's events: a refused event's successors in the batch are sent,
// but the relay's ordered mode publishes one event per aggregate per round.
func (f *Faulty) Capabilities() core.PublisherCapabilities { return f.Inner.Capabilities() }

// Publish injects faults, sends the rest through Inner and reports the
// outcome per event.
func (f *Faulty) Publish(ctx context.Context, events []core.Event) error {
	if f.Delay > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(f.Delay):
		}
	}
	be := core.NewBatchError(len(events))
	var send []core.Event
	var idx []int // index in events of each sent event
	lie := make([]bool, len(events))
	for i, ev := range events {
		if f.draw() < f.FailRate {
			f.refused.Add(1)
			be.Errs[i] = ErrInjected
			continue
		}
		send = append(send, ev)
		idx = append(idx, i)
		if f.draw() < f.DuplicateRate {
			f.doubled.Add(1)
			send = append(send, ev)
			idx = append(idx, i)
		}
		if f.draw() < f.FailAfterSendRate {
			f.failedAfterSend.Add(1)
			lie[i] = true
		}
	}
	if len(send) > 0 {
		errs := core.EventErrors(f.Inner.Publish(ctx, send), len(send))
		for j, err := range errs {
			if err != nil && be.Errs[idx[j]] == nil {
				be.Errs[idx[j]] = err
			}
		}
	}
	for i := range events {
		if lie[i] && be.Errs[i] == nil {
			be.Errs[i] = ErrInjected
		}
	}
	return be.ErrOrNil()
}
