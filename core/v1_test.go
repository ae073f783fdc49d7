package core_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/logbuf"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// An error marked Permanent dead-letters its event at once, whatever the
// attempts left; the other events of the batch are not affected.
func TestPermanentErrorDeadLettersAtOnce(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	s.add(testEvents(3, "t")...)
	pub := &recordingPub{fail: func(ev core.Event) error {
		if ev.Seq == 2 {
			return core.Permanent(fmt.Errorf("%w: too large for the broker", core.ErrInvalidEvent))
		}
		return nil
	}}
	r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet})
	res, err := r.ProcessBatch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if res != (core.RelayCounters{Batches: 1, Claimed: 3, Published: 2, Failed: 1, DeadLettered: 1}) {
		t.Errorf("result %+v, want 2 published and 1 dead-lettered at its first attempt", res)
	}
	ev := s.get(2)
	if ev.DeadAt == nil || ev.AttemptCount != 1 || !strings.Contains(ev.LastError, "too large") {
		t.Errorf("permanently failed event %+v, want dead after 1 attempt with its error", ev)
	}
	if core.Permanent(nil) != nil || core.IsPermanent(errors.New("x")) || !core.IsPermanent(fmt.Errorf("w: %w", core.Permanent(errors.New("x")))) {
		t.Error("Permanent/IsPermanent")
	}
}

// brokenStore fails every claim with err.
type brokenStore struct {
	*testStore
	err    error
	claims int
	mu     sync.Mutex
}

func (s *brokenStore) Claim(context.Context, core.ClaimRequest) (core.Claim, error) {
	s.mu.Lock()
	s.claims++
	s.mu.Unlock()
	return nil, s.err
}

// A store whose table does not exist will not heal: Run stops and returns
// the error instead of retrying it forever.
func TestRunReturnsNotMigrated(t *testing.T) {
	t.Parallel()
	s := &brokenStore{testStore: newMemStore(), err: fmt.Errorf("%w: table outbox_events: relation does not exist", core.ErrNotMigrated)}
	r, _ := core.NewRelay(s, &recordingPub{}, core.RelayOptions{Logger: quiet, Concurrency: 3})
	done := make(chan error, 1)
	go func() { done <- r.Run(t.Context()) }()
	select {
	case err := <-done:
		if !errors.Is(err, core.ErrNotMigrated) {
			t.Fatalf("Run = %v, want ErrNotMigrated", err)
		}
	case <-time.After(wait.Stall):
		t.Fatal("Run kept retrying a missing table")
	}
}

// A broker outage writes a line when it starts and one when it ends, and a
// failed batch one line, not one per event; a database outage likewise.
func TestDownAndBackLoggedOncePerState(t *testing.T) {
	t.Parallel()
	var logs logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s := newMemStore()
	s.add(testEvents(50, "t")...)
	down := true
	var mu sync.Mutex
	pub := &recordingPub{fail: func(core.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return errors.New("connection refused")
		}
		return nil
	}}
	r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: log, BatchSize: 10, Retry: core.RetryPolicy{InitialBackoff: time.Nanosecond, Jitter: -1}})
	for range 5 {
		time.Sleep(2 * time.Millisecond)
		if _, err := r.ProcessBatch(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	down = false
	mu.Unlock()
	time.Sleep(2 * time.Millisecond)
	if _, err := r.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if n := strings.Count(out, "the broker took no event"); n != 1 {
		t.Errorf("%d 'broker down' lines for one outage, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, `msg="txoutbox: the broker takes events again"`); n != 1 {
		t.Errorf("%d 'broker back' lines, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "level=WARN"); n > 2 {
		t.Errorf("%d warnings for 5 failed batches of 10, want the outage's line only:\n%s", n, out)
	}
	if c := r.Counters(); c.Failed != 50 || c.Published != 50 {
		t.Errorf("counters %+v: the log is quieter, the counts must stay exact", c)
	}

	logs = logbuf.Buffer{}
	st := &brokenStore{testStore: newMemStore(), err: errors.New("connection refused")}
	r, _ = core.NewRelay(st, pub, core.RelayOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil)), PollInterval: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	wait.Until(t, "ten failed claims", func() bool { st.mu.Lock(); defer st.mu.Unlock(); return st.claims >= 10 })
	cancel()
	<-done
	if n := strings.Count(logs.String(), "relay batch failed"); n != 1 {
		t.Errorf("%d error lines for %d failed claims, want 1:\n%s", n, st.claims, logs.String())
	}
}

// The store's capabilities wire the relay: its wake-up signal reaches a
// running relay with no Notifier, and its leaser is built for ordered mode
// with the relay's partition count.
func TestRelayWiresItselfFromCapabilities(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	pub := &recordingPub{}
	r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet, PollInterval: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	time.Sleep(20 * time.Millisecond)
	s.add(testEvents(1, "t")...) // commits through the store: its signal
	wait.Until(t, "an event committed to the relay's store (poll interval 1h)", func() bool { return pub.count() == 1 })

	var built core.LeaserConfig
	ls := leasingStore{testStore: newMemStore(), build: func(c core.LeaserConfig) (core.PartitionLeaser, error) {
		built = c
		return &fakeLeaser{n: c.PartitionCount}, nil
	}}
	r, err := core.NewRelay(ls, pub, core.RelayOptions{Logger: quiet, Ordering: core.OrderingOn, Ordered: core.OrderedOptions{PartitionCount: 7}})
	if err != nil {
		t.Fatal(err)
	}
	if built.PartitionCount != 7 || r.Leaser() == nil || r.Leaser().PartitionCount() != 7 {
		t.Errorf("leaser built with %+v, relay's %v; want the store's, with 7 partitions", built, r.Leaser())
	}
	r, err = core.NewRelay(ls, pub, core.RelayOptions{Logger: quiet, Ordering: core.OrderingOn, Ordered: core.OrderedOptions{NoLeaser: true}})
	if err != nil || r.Leaser() != nil {
		t.Errorf("NoLeaser: relay leaser %v, %v; want none", r.Leaser(), err)
	}
}

// leasingStore offers a leaser (core.LeaserSource).
type leasingStore struct {
	*testStore
	build func(core.LeaserConfig) (core.PartitionLeaser, error)
}

func (s leasingStore) NewLeaser(c core.LeaserConfig) (core.PartitionLeaser, error) { return s.build(c) }

// Sizes are bounded and waits cannot be negative.
func TestRelayOptionsBounds(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]core.RelayOptions{
		"batch size over the limit":  {BatchSize: core.MaxBatchSize + 1},
		"concurrency over the limit": {Concurrency: core.MaxConcurrency + 1},
		"error length over":          {MaxErrorLength: core.ErrorLengthLimit + 1},
		"negative initial backoff":   {Retry: core.RetryPolicy{InitialBackoff: -time.Second}},
		"negative max backoff":       {Retry: core.RetryPolicy{MaxBackoff: -time.Second}},
		"negative attempts":          {Retry: core.RetryPolicy{MaxAttempts: -1}},
		"multiplier below 1":         {Retry: core.RetryPolicy{Multiplier: 0.5}},
		"jitter above 1":             {Retry: core.RetryPolicy{Jitter: 2}},
		"negative batch size":        {BatchSize: -1},
	} {
		if _, err := core.NewRelay(newMemStore(), &recordingPub{}, o); !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("%s: NewRelay = %v, want ErrInvalidOptions", name, err)
		}
	}
	if _, err := core.NewRelay(newMemStore(), &recordingPub{}, core.RelayOptions{BatchSize: core.MaxBatchSize, Logger: quiet}); err != nil {
		t.Errorf("BatchSize at the limit: %v", err)
	}
}

// A flapping broker (down, one batch through, down again, within a second
// or two) is one outage in the log: the back line waits until the broker
// has taken events for a while, and comes at once when a Drain ends.
func TestFlappingBrokerLoggedAsOneOutage(t *testing.T) {
	t.Parallel()
	var logs logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s := newMemStore()
	s.add(testEvents(60, "t")...)
	var mu sync.Mutex
	down := true
	pub := &recordingPub{fail: func(core.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return errors.New("circuit breaker is open")
		}
		return nil
	}}
	r, _ := core.NewRelay(s, pub, core.RelayOptions{Logger: log, BatchSize: 10, Retry: core.RetryPolicy{InitialBackoff: time.Nanosecond, Jitter: -1}})
	set := func(v bool) {
		mu.Lock()
		down = v
		mu.Unlock()
	}
	for _, state := range []bool{true, false, true, false, true, false} {
		set(state)
		time.Sleep(2 * time.Millisecond)
		if _, err := r.ProcessBatch(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "the broker took no event"); n != 1 {
		t.Errorf("%d 'broker down' lines for a broker that flapped three times, want 1:\n%s", n, logs.String())
	}
	if _, err := r.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), `msg="txoutbox: the broker takes events again"`); n != 1 {
		t.Errorf("%d 'broker back' lines after the drain, want 1:\n%s", n, logs.String())
	}
}
