package outboxtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// RunScheduled proves scheduled events (core.Event.NotBefore) through the
// fixture's relay: core.Relay on Store, or the relay of another mode
// (StoreFixture.NewRelay, such as log mode, which hands scheduled events
// to the table). An event is published once and never before its time,
// though the relay that saw it written stops before its time and another
// takes over; an event scheduled for tomorrow is not published, and a
// rolled-back one never. The relays poll once an hour, so the event is
// published at all only if the store tells the relay when it falls due
// (core.NextDueReader).
func RunScheduled(t *testing.T, newStore NewStoreFunc) {
	t.Run("NeverEarlyAcrossRestarts", func(t *testing.T) {
		t.Parallel()
		f := newStore(t)
		evs := suiteEvents(t, uniqueType("scheduled"), 3, 3)
		now, soon, tomorrow := evs[0], evs[1], evs[2]
		const delay = 3 * time.Second
		soon.NotBefore = time.Now().Add(delay)
		tomorrow.NotBefore = time.Now().Add(24 * time.Hour)
		rolledBack := suiteEvents(t, uniqueType("scheduled"), 1, 1)
		rolledBack[0].NotBefore = time.Now().Add(delay / 2)

		rec := &publishTimes{at: map[string][]time.Time{}}
		opts := core.RelayOptions{PollInterval: time.Hour}
		ctx := t.Context()

		stop := runUntilStopped(t, f, rec, opts)
		mustEnqueue(t, f, rolledBack, false)
		mustEnqueue(t, f, []core.Event{now, soon, tomorrow}, true)
		if !rec.waitFor(ctx, now.ID, 0) {
			t.Fatalf("the unscheduled event was not published: the relay, which polls hourly, was not woken")
		}
		stop()
		if at := rec.times(soon.ID); len(at) != 0 {
			if at[0].Before(soon.NotBefore) {
				t.Fatalf("the event scheduled %v ahead was published %v early", delay, soon.NotBefore.Sub(at[0]))
			}
			// On a machine so slow that the first relay ran past the
			// event's time, the restart has nothing left to judge.
			t.Logf("the first relay ran past the event's time and published it then; the restart judges nothing")
		} else {
			stop = runUntilStopped(t, f, rec, opts)
			defer stop()
			if !rec.waitFor(ctx, soon.ID, delay) {
				t.Fatalf("the event scheduled %v ahead was not published by a relay that polls once an hour: the store never said when it falls due", delay)
			}
			stop()
		}
		at := rec.times(soon.ID)
		if len(at) != 1 || at[0].Before(soon.NotBefore) {
			t.Errorf("scheduled event published at %v, want once, not before %v", at, soon.NotBefore)
		} else {
			t.Logf("scheduled event published %v after its time", at[0].Sub(soon.NotBefore))
		}
		if n := len(rec.times(now.ID)); n != 1 {
			t.Errorf("unscheduled event published %d times, want 1", n)
		}
		if n := len(rec.times(tomorrow.ID)); n != 0 {
			t.Errorf("the event scheduled for tomorrow was published %d times", n)
		}
		if n := len(rec.times(rolledBack[0].ID)); n != 0 {
			t.Errorf("a rolled-back scheduled event was published %d times", n)
		}
	})
}

// runUntilStopped runs the fixture's relay until the returned function is
// called (or the test ends), which waits for it to stop.
func runUntilStopped(t *testing.T, f *StoreFixture, pub core.Publisher, opts core.RelayOptions) (stop func()) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	var r Relay
	if f.NewRelay == nil {
		r = mustRelay(t, f, pub, opts)
	} else {
		var err error
		if r, err = f.NewRelay(pub, opts); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(ctx); err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// publishTimes is a publisher that records when each event was published.
type publishTimes struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (p *publishTimes) Publish(_ context.Context, batch []core.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for _, ev := range batch {
		p.at[ev.ID] = append(p.at[ev.ID], now)
	}
	return nil
}

func (p *publishTimes) Capabilities() core.PublisherCapabilities { return core.PublisherCapabilities{} }

func (p *publishTimes) times(id string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.at[id]...)
}

// waitFor waits until id was published, after at least notBefore: it
// reports false when nothing came for wait.Stall after that.
func (p *publishTimes) waitFor(ctx context.Context, id string, notBefore time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(notBefore):
	}
	return wait.Poll(ctx, "event "+id+" published", func() (bool, any) { return len(p.times(id)) > 0, nil }) == nil
}
