package outboxtest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// e2eRelayOptions are quick to retry, so that the suite finishes in seconds.
// Two workers, unless the store serves fewer.
func e2eRelayOptions(t *testing.T) core.RelayOptions {
	return core.RelayOptions{
		BatchSize:    25,
		PollInterval: 50 * time.Millisecond,
		Concurrency:  2,
		Retry:        core.RetryPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, MaxAttempts: 1000},
		Logger:       testLogger(t),
	}
}

// startRelay runs a relay until the test ends and waits for it to stop.
func startRelay(t *testing.T, f *StoreFixture, pub core.Publisher, opts core.RelayOptions) Relay {
	t.Helper()
	var r Relay
	if f.NewRelay == nil {
		r = mustRelay(t, f, pub, opts)
	} else {
		if opts.Logger == nil {
			opts.Logger = testLogger(t)
		}
		var err error
		if r, err = f.NewRelay(pub, opts); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return r
}

// RunEndToEnd drives the real core.Relay from a store through a real broker
// to a subscriber on it: every committed event arrives, with its headers and
// payload; no rolled-back event ever does; and a relay woken by the producer
// publishes without waiting for its poll interval.
func RunEndToEnd(t *testing.T, newStore NewStoreFunc, newBroker NewBrokerFunc) {
	t.Run("CommittedArriveRolledBackNever", func(t *testing.T) {
		t.Parallel()
		f, b := newStore(t), newBroker(t)
		et := uniqueType("e2e")
		col := Collect(t, b.Subscriber, b.topic(et))
		committed := suiteEvents(t, et, 60, 6)
		rolledBack := suiteEvents(t, et, 20, 6)
		explainMissing(t, f, col, committed)
		startRelay(t, f, b.Publisher, e2eRelayOptions(t))
		for i := 0; i < len(committed); i += 15 {
			mustEnqueue(t, f, committed[i:i+15], true)
			mustEnqueue(t, f, rolledBack[i/3:i/3+5], false)
		}
		ctx := wait.Context(t, "deliveries", b.deliveryTimeout(t), col.seen)
		got := col.Wait(ctx, ids(committed))
		// No order check here: this relay runs unordered workers. Brokers
		// prove their order in RunPublisher, the ordered relay in package
		// ordered.
		if err := CheckMessages(committed, got); err != nil {
			t.Error(err)
		}
		waitPublished(t, f, committed)
		for _, ev := range rolledBack {
			if n := col.Count(ev.ID); n != 0 {
				t.Errorf("rolled-back event %s arrived %d times", ev.ID, n)
			}
		}
	})

	// A relay built on a store that offers a wake-up signal is woken by
	// the store's own writes in this process, with no wiring: the poll
	// interval here is an hour.
	t.Run("StoreWakesItsRelay", func(t *testing.T) {
		t.Parallel()
		f, b := newStore(t), newBroker(t)
		if ws, ok := core.StoreAs[core.WakeupSource](f.Store); !ok || ws.Wakeups() == nil {
			t.Log("the store reports no same-process wake-up (core.WakeupSource); its relays poll")
			return
		}
		et := uniqueType("wake")
		col := Collect(t, b.Subscriber, b.topic(et))
		opts := e2eRelayOptions(t)
		opts.PollInterval = time.Hour // only the store's wake-up can publish in time
		pub := &tracedPublisher{Publisher: b.Publisher}
		startRelay(t, f, pub, opts)
		// After startRelay's cleanup in the code, so before it at the
		// end: a publish still in flight shows as such.
		t.Cleanup(func() {
			if t.Failed() {
				t.Log(pub.summary())
			}
		})
		// Let the workers run their first claim and go idle.
		time.Sleep(200 * time.Millisecond)
		evs := suiteEvents(t, et, 3, 1)
		for i := range evs {
			mustEnqueue(t, f, evs[i:i+1], true)
		}
		explainMissing(t, f, col, evs)
		col.Wait(wait.Context(t, "deliveries", b.deliveryTimeout(t), col.seen), ids(evs))
	})
}

// explainMissing says, if the test fails, where each event that never
// reached the subscriber stands in the outbox: never claimed, published
// (then the broker or the subscriber lost it), or failing with its error.
// A delivery wait that times out says only "never arrived"; this is the
// evidence a rare failure on a loaded machine needs.
func explainMissing(t *testing.T, f *StoreFixture, col *Collection, evs []core.Event) {
	t.Helper()
	t.Cleanup(func() {
		if !t.Failed() || f.Get == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, ev := range evs {
			if col.Count(ev.ID) > 0 {
				continue
			}
			got, err := f.Get(ctx, ev.ID)
			switch {
			case err != nil:
				t.Logf("event %s: %v", ev.ID, err)
			case got.PublishedAt != nil:
				t.Logf("event %s: published at %s, never received", ev.ID, got.PublishedAt.Format(time.RFC3339Nano))
			default:
				t.Logf("event %s: unpublished, %d attempts, last error %q", ev.ID, got.AttemptCount, got.LastError)
			}
		}
	})
}

// RunOutage proves that a broker outage loses nothing: events enqueued while
// the broker is down stay in the outbox with their attempts and last error
// growing, and all arrive once it is back. It takes the broker down, so run
// it apart from tests that share the broker (make test runs tests named
// *Outage* in a serial step of their own).
func RunOutage(t *testing.T, newStore NewStoreFunc, newBroker NewBrokerFunc) {
	f, b := newStore(t), newBroker(t)
	if b.Stop == nil || b.Start == nil {
		t.Fatal("BrokerFixture needs Stop and Start for the outage test")
	}
	et := uniqueType("outage")
	col := Collect(t, b.Subscriber, b.topic(et))
	before := suiteEvents(t, et, 10, 3)
	during := suiteEvents(t, et, 30, 3)
	startRelay(t, f, b.Publisher, e2eRelayOptions(t))
	// Progress is a delivery, or an attempt recorded during the outage.
	var attempts atomic.Int64
	ctx := wait.Context(t, "deliveries and failed attempts", b.deliveryTimeout(t), func() any {
		return fmt.Sprint(col.seen(), " ", attempts.Load())
	})

	mustEnqueue(t, f, before, true)
	col.Wait(ctx, ids(before))

	b.Stop(t)
	restarted := false
	defer func() {
		if !restarted {
			b.Start(t)
		}
	}()
	mustEnqueue(t, f, during, true)
	// Every event must still be pending, and have failed at least once.
	// With a publisher that keeps aggregate order the relay runs in
	// ordered mode, where an aggregate's later events wait behind its
	// failing first one without an attempt of their own: there, the
	// first event of every aggregate must have failed.
	mustFail := during
	if b.Publisher.Capabilities().PreservesAggregateOrder {
		mustFail = nil
		seen := map[string]bool{}
		for _, ev := range during {
			if !seen[ev.AggregateID] {
				seen[ev.AggregateID] = true
				mustFail = append(mustFail, ev)
			}
		}
	}
	for {
		for _, ev := range during {
			if s := mustGet(t, f, ev.ID); s.PublishedAt != nil {
				t.Fatalf("event %s marked published while the broker was down", ev.ID)
			}
		}
		failed := 0
		for _, ev := range mustFail {
			if s := mustGet(t, f, ev.ID); s.AttemptCount >= 1 && s.LastError != "" {
				failed++
			}
		}
		attempts.Store(int64(failed))
		if failed == len(mustFail) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("only %d of %d events recorded a failed attempt during the outage (%v)", failed, len(mustFail), context.Cause(ctx))
		case <-time.After(100 * time.Millisecond):
		}
	}
	b.Start(t)
	restarted = true
	got := col.Wait(ctx, ids(during))
	if err := CheckMessages(append(before, during...), got); err != nil {
		t.Error(err)
	}
	waitPublished(t, f, during)
}

// waitPublished waits until the store marked every event published. It
// waits on its own progress, not on the deliveries': the marks follow the
// deliveries, and on a busy machine the reads that check them can take
// longer than the deliveries' stall limit.
func waitPublished(t *testing.T, f *StoreFixture, evs []core.Event) {
	t.Helper()
	if f.Settled != nil {
		// Settled shows no progress of its own: it has the stall limit
		// from now to confirm what was delivered.
		ctx := wait.Context(t, "the relay to confirm its position", wait.Stall, func() any { return nil })
		if err := f.Settled(ctx); err != nil && t.Context().Err() == nil {
			t.Fatalf("the relay never confirmed the events that arrived: %v", err)
		}
		return
	}
	next := 0 // evs[:next] are marked published
	wait.For(t, "every delivered event marked published", func() (bool, any) {
		for ; next < len(evs); next++ {
			if s := mustGet(t, f, evs[next].ID); s.PublishedAt == nil {
				return false, fmt.Sprintf("%d of %d marked; %s not yet", next, len(evs), evs[next].ID)
			}
		}
		return true, nil
	})
}

// tracedPublisher records the publisher's calls, so that a failed delivery
// wait can tell events the relay never handed over (never claimed) from a
// publish that never returned: both leave the row unpublished with no
// attempt.
type tracedPublisher struct {
	core.Publisher
	mu                sync.Mutex
	calls, returned   int
	events            int
	lastErr, inFlight string
}

func (p *tracedPublisher) Publish(ctx context.Context, batch []core.Event) error {
	p.mu.Lock()
	p.calls++
	p.events += len(batch)
	ids := make([]string, len(batch))
	for i := range batch {
		ids[i] = batch[i].ID
	}
	p.inFlight = strings.Join(ids, ",")
	p.mu.Unlock()
	err := p.Publisher.Publish(ctx, batch)
	p.mu.Lock()
	p.returned++
	p.inFlight = ""
	if err != nil {
		p.lastErr = err.Error()
	}
	p.mu.Unlock()
	return err
}

func (p *tracedPublisher) summary() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("publisher: %d calls with %d events, %d returned; in flight: %q; last error: %q", p.calls, p.events, p.returned, p.inFlight, p.lastErr)
}
