package core_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func testEvents(n int, eventType string) []core.Event {
	evs := make([]core.Event, n)
	for i := range evs {
		evs[i] = core.Event{AggregateID: fmt.Sprint(i % 3), EventType: eventType, Payload: []byte(`{}`)}
	}
	return evs
}

type recordingPub struct {
	mu   sync.Mutex
	seen map[string]int
	fail func(ev core.Event) error
}

func (p *recordingPub) Publish(ctx context.Context, evs []core.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seen == nil {
		p.seen = map[string]int{}
	}
	be := core.NewBatchError(len(evs))
	for i, ev := range evs {
		if p.fail != nil {
			if err := p.fail(ev); err != nil {
				be.Errs[i] = err
				continue
			}
		}
		p.seen[ev.ID]++
	}
	return be.ErrOrNil()
}

func (*recordingPub) Capabilities() core.PublisherCapabilities { return core.PublisherCapabilities{} }

func (p *recordingPub) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.seen)
}

func TestNewRelayRejectsBadOptions(t *testing.T) {
	t.Parallel()
	if _, err := core.NewRelay(nil, &recordingPub{}, core.RelayOptions{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("nil store: %v", err)
	}
	if _, err := core.NewRelay(newMemStore(), &recordingPub{}, core.RelayOptions{BatchSize: -1}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("negative batch size: %v", err)
	}
	r, err := core.NewRelay(newMemStore(), &recordingPub{}, core.RelayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o := r.Options()
	if o.BatchSize != 100 || o.PollInterval != time.Second || o.Concurrency != 1 || o.Retry.MaxAttempts != 25 {
		t.Errorf("defaults: %+v", o)
	}
}

type limitedStore struct{ *testStore }

func (limitedStore) Capabilities() core.StoreCapabilities {
	return core.StoreCapabilities{MaxConcurrency: 1}
}

func TestRelayCapsConcurrencyToStore(t *testing.T) {
	t.Parallel()
	r, err := core.NewRelay(limitedStore{newMemStore()}, &recordingPub{}, core.RelayOptions{Concurrency: 8, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if r.Options().Concurrency != 1 {
		t.Errorf("concurrency %d, want 1", r.Options().Concurrency)
	}
}

func TestProcessBatchRecordsEachOutcome(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	s.add(testEvents(5, "t")...)
	pub := &recordingPub{fail: func(ev core.Event) error {
		if ev.Seq == 3 {
			return errors.New("nope")
		}
		return nil
	}}
	r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet, Retry: core.RetryPolicy{InitialBackoff: time.Hour, Jitter: -1}})
	res, err := r.ProcessBatch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if res != (core.RelayCounters{Batches: 1, Claimed: 5, Published: 4, Failed: 1}) {
		t.Errorf("result %+v", res)
	}
	if c := r.Counters(); c != res {
		t.Errorf("running totals %+v after one batch, want the batch's %+v", c, res)
	}
	f := s.get(3)
	if f.PublishedAt != nil || f.AttemptCount != 1 || f.LastError != "nope" || f.NextAttemptAt.Sub(f.CreatedAt) < 59*time.Minute {
		t.Errorf("failed event %+v", f)
	}
	if got := s.get(1); got.PublishedAt == nil {
		t.Errorf("event 1 not published")
	}
}

func TestWholeBatchErrorFailsEveryEvent(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	s.add(testEvents(3, "t")...)
	pub := core.PublisherFunc(func(context.Context, []core.Event) error { return errors.New("broker down") })
	r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet})
	res, err := r.ProcessBatch(t.Context())
	if err != nil || res.Failed != 3 {
		t.Fatalf("%+v %v", res, err)
	}
}

func TestPanickingPublisherFailsBatchNotRelay(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	s.add(testEvents(2, "t")...)
	pub := core.PublisherFunc(func(context.Context, []core.Event) error { panic("boom") })
	r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet})
	res, err := r.ProcessBatch(t.Context())
	if err != nil || res.Failed != 2 {
		t.Fatalf("%+v %v", res, err)
	}
	if !strings.Contains(s.get(1).LastError, "panicked: boom") {
		t.Errorf("last error %q", s.get(1).LastError)
	}
}

func TestDeadLetterAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	s.add(testEvents(1, "t")...)
	pub := core.PublisherFunc(func(context.Context, []core.Event) error { return errors.New("poison") })
	r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet, Retry: core.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Nanosecond, Jitter: -1}})
	for range 5 {
		time.Sleep(time.Millisecond)
		if _, err := r.ProcessBatch(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	ev := s.get(1)
	if ev.DeadAt == nil || ev.AttemptCount != 3 {
		t.Errorf("after 5 rounds: %+v", ev)
	}
	if c := r.Counters(); c.DeadLettered != 1 || c.Failed != 3 {
		t.Errorf("counters %+v", c)
	}
}

func TestRunDrainsAndStopsOnCancel(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	s.add(testEvents(1000, "t")...)
	pub := &recordingPub{}
	r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet, Concurrency: 4, BatchSize: 10, PollInterval: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	wait.For(t, "1000 events published", func() (bool, any) { n := pub.count(); return n >= 1000, n })
	if pub.count() != 1000 {
		t.Fatalf("published %d of 1000", pub.count())
	}
	for id, n := range pub.seen {
		if n != 1 {
			t.Errorf("event %s published %d times by concurrent workers", id, n)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v", err)
		}
	case <-time.After(wait.Stall):
		t.Fatal("Run did not stop after cancel")
	}
}

// On a fake clock (synctest): the notified relay publishes long before its
// hourly poll could have, however slow the machine.
func TestNotifyWakesIdleRelay(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newMemStore()
		pub := &recordingPub{}
		r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet, PollInterval: time.Hour})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(ctx) }()
		synctest.Wait() // the first claim found nothing; the relay sleeps
		// Notify first, as a producer does before its commit; the event
		// shows up a few milliseconds later.
		start := time.Now()
		r.Notify()
		time.Sleep(3 * time.Millisecond)
		s.add(testEvents(1, "t")...)
		for pub.count() == 0 {
			time.Sleep(time.Millisecond)
		}
		if took := time.Since(start); took >= time.Hour {
			t.Fatalf("published %v after Notify: on the hourly poll, not on the wake-up", took)
		}
		cancel()
		<-done
	})
}

// A worker woken by Notify keeps looking for a little while after a claim
// that found events: a producer that notified before that claim may commit
// just after it, and must not wait for the poll.
func TestWakeGraceOutlivesPartialClaim(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	pub := &recordingPub{}
	r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet, PollInterval: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	time.Sleep(20 * time.Millisecond)
	s.add(testEvents(1, "t")...)
	r.Notify()
	wait.Until(t, "the notified event", func() bool { return pub.count() == 1 })
	// Notified with the first, committed only now; no Notify of its own.
	s.add(testEvents(1, "t")...)
	wait.Until(t, "the event committed after the claim (poll interval 1h)", func() bool { return pub.count() == 2 })
}

// countingStore counts the claims of a testStore.
type countingStore struct {
	*testStore
	claims atomic.Int64
}

func (s *countingStore) Claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	s.claims.Add(1)
	return s.testStore.Claim(ctx, req)
}

// Notifies faster than the cooldown coalesce: a worker claims at most once
// per Cooldown, and still publishes everything.
func TestCooldownBoundsClaimRate(t *testing.T) {
	t.Parallel()
	s := &countingStore{testStore: newMemStore()}
	pub := &recordingPub{}
	const cooldown = 25 * time.Millisecond
	r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet, PollInterval: time.Hour, Cooldown: cooldown})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	time.Sleep(10 * time.Millisecond)
	before := s.claims.Load()
	start := time.Now()
	const n = 200
	for range n {
		s.add(testEvents(1, "t")...)
		r.Notify()
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	wait.Until(t, "all notified events", func() bool { return pub.count() == n })
	claims := s.claims.Load() - before
	// One claim per cooldown while notified, plus the wake grace's few
	// looks after the last event.
	if most := int64(elapsed/cooldown) + 2 + int64(len(core.WakeGrace)); claims > most {
		t.Errorf("%d claims in %s with a %s cooldown, want at most %d", claims, elapsed, cooldown, most)
	}
	if claims >= n/2 {
		t.Errorf("%d claims for %d notifies: they did not coalesce", claims, n)
	}
}

// Under a trickle of wake-ups the cooldown stretches, doubling while
// claims find few events, up to MaxCooldown; fuller claims shrink it, and
// an empty claim (a quiet spell) resets it, so that the next event after
// it is claimed at once.
func TestCooldownStretchesUnderATrickle(t *testing.T) {
	t.Parallel()
	r, err := core.NewRelay(newMemStore(), &recordingPub{}, core.RelayOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	cd := time.Millisecond
	var steps []time.Duration
	for _, claimed := range []int{1, 1, 2, 3, 3, 3, 50, 50, 50, 1, 0} {
		cd = r.NextCooldown(cd, claimed)
		steps = append(steps, cd)
	}
	ms := time.Millisecond
	want := []time.Duration{2 * ms, 4 * ms, 5 * ms, 5 * ms, 5 * ms, 5 * ms, 2500 * time.Microsecond, 1250 * time.Microsecond, ms, 2 * ms, ms}
	if !slices.Equal(steps, want) {
		t.Fatalf("cooldowns %v, want %v", steps, want)
	}
	// MaxCooldown equal to Cooldown: no stretching.
	r, err = core.NewRelay(newMemStore(), &recordingPub{}, core.RelayOptions{Logger: quiet, Cooldown: 2 * ms, MaxCooldown: 2 * ms})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.NextCooldown(2*ms, 1); got != 2*ms {
		t.Fatalf("cooldown stretched to %v with MaxCooldown = Cooldown", got)
	}
	for _, bad := range []core.RelayOptions{{MaxCooldown: -1}, {Cooldown: 10 * ms, MaxCooldown: 5 * ms}} {
		if _, err := core.NewRelay(newMemStore(), &recordingPub{}, bad); !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("NewRelay(%+v) = %v, want ErrInvalidOptions", bad, err)
		}
	}
}

func TestShutdownLetsBatchInFlightFinish(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	s.add(testEvents(3, "t")...)
	started := make(chan struct{})
	var published atomic.Int32
	pub := core.PublisherFunc(func(ctx context.Context, evs []core.Event) error {
		close(started)
		time.Sleep(100 * time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		published.Add(int32(len(evs)))
		return nil
	})
	r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet, ShutdownTimeout: 5 * time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	go func() { <-started; cancel() }()
	res, err := r.ProcessBatch(ctx)
	if err != nil || res.Published != 3 || published.Load() != 3 {
		t.Fatalf("batch cut off by shutdown: %+v %v", res, err)
	}
	if s.get(1).PublishedAt == nil {
		t.Error("event not marked after graceful shutdown")
	}
}

func TestShutdownTimeoutReleasesBatchUnmarked(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	s.add(testEvents(2, "t")...)
	started := make(chan struct{})
	pub := core.PublisherFunc(func(ctx context.Context, evs []core.Event) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	})
	r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet, ShutdownTimeout: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	go func() { <-started; cancel() }()
	if _, err := r.ProcessBatch(ctx); err != nil {
		t.Fatal(err)
	}
	ev := s.get(1)
	if ev.AttemptCount != 0 || ev.PublishedAt != nil || ev.LastError != "" {
		t.Errorf("an event cut off by shutdown was marked: %+v", ev)
	}
	if c := r.Counters(); c.Released != 2 {
		t.Errorf("counters %+v, want 2 released", c)
	}
}

// barrierPub holds each Publish until want of them are in flight at once
// (or a second passed: run it on synctest's clock), and records the most it
// saw.
type barrierPub struct {
	recordingPub
	want     int
	inflight atomic.Int32
	most     atomic.Int32
}

func (p *barrierPub) Publish(ctx context.Context, evs []core.Event) error {
	n := p.inflight.Add(1)
	defer p.inflight.Add(-1)
	for {
		if m := p.most.Load(); n > m && !p.most.CompareAndSwap(m, n) {
			continue
		}
		break
	}
	for deadline := time.Now().Add(time.Second); p.most.Load() < int32(p.want) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	return p.recordingPub.Publish(ctx, evs)
}

// Drain runs Concurrency workers, as Run does: a benchmark or tool that
// drains a backlog with four workers gets four claims in flight.
func TestDrainRunsConcurrencyWorkers(t *testing.T) {
	t.Parallel()
	// On a fake clock, the barrier's one-second give-up comes only once
	// every worker is blocked: a slow machine cannot make it pass early.
	synctest.Test(t, func(t *testing.T) {
		s := newMemStore()
		s.add(testEvents(40, "t")...)
		pub := &barrierPub{want: 4}
		r, err := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet, Concurrency: 4, BatchSize: 10})
		if err != nil {
			t.Fatal(err)
		}
		res, err := r.Drain(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if res.Published != 40 || pub.count() != 40 {
			t.Fatalf("Drain published %d (publisher saw %d) of 40", res.Published, pub.count())
		}
		if got := pub.most.Load(); got != 4 {
			t.Errorf("at most %d publishes in flight at once, want 4 (Concurrency)", got)
		}
		for id, n := range pub.seen {
			if n != 1 {
				t.Errorf("event %s published %d times", id, n)
			}
		}
	})
}
