package core_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/logbuf"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

func TestPrepare(t *testing.T) {
	t.Parallel()
	ev := core.Event{EventType: "order.created"}
	if err := ev.Prepare(); err != nil {
		t.Fatal(err)
	}
	id, err := uuid.Parse(ev.ID)
	if err != nil || id.Version() != 7 {
		t.Errorf("ID %q: want a UUIDv7 (%v)", ev.ID, err)
	}
	if string(ev.Payload) != "null" {
		t.Errorf("empty payload became %q, want null", ev.Payload)
	}
	for name, bad := range map[string]core.Event{
		"no type":      {Payload: []byte(`{}`)},
		"invalid json": {EventType: "x", Payload: []byte(`{"a":`)},
		"bad id":       {EventType: "x", ID: "42"},
	} {
		if err := bad.Prepare(); !errors.Is(err, core.ErrInvalidEvent) {
			t.Errorf("%s: %v, want ErrInvalidEvent", name, err)
		}
	}
}

func TestMessageHeadersIdentityWins(t *testing.T) {
	t.Parallel()
	ev := core.Event{ID: "id-1", EventType: "t", AggregateID: "a", Headers: map[string]string{core.HeaderEventID: "forged", "x": "y"}}
	h := ev.MessageHeaders()
	if h[core.HeaderEventID] != "id-1" || h["x"] != "y" || h[core.HeaderAggregateID] != "a" || h[core.HeaderEventType] != "t" {
		t.Errorf("headers %v", h)
	}
}

func TestBackoffGrowsWithinBounds(t *testing.T) {
	t.Parallel()
	p := core.RetryPolicy{InitialBackoff: time.Second, MaxBackoff: time.Minute, Jitter: 0.5}
	for attempt := 1; attempt <= 40; attempt++ {
		want := min(time.Second<<min(attempt-1, 30), time.Minute)
		for range 20 {
			d := p.Backoff(attempt)
			if d > want || d < want/2 {
				t.Fatalf("attempt %d: backoff %v outside [%v, %v]", attempt, d, want/2, want)
			}
		}
	}
	exact := core.RetryPolicy{InitialBackoff: time.Second, Jitter: -1}
	if d := exact.Backoff(3); d != 4*time.Second {
		t.Errorf("no jitter: attempt 3 backoff %v, want 4s", d)
	}
	if !exact.Exhausted(25) || exact.Exhausted(24) {
		t.Error("default MaxAttempts is 25")
	}
}

func TestEventErrors(t *testing.T) {
	t.Parallel()
	all := core.EventErrors(errors.New("down"), 3)
	for _, err := range all {
		if err == nil {
			t.Fatal("a whole-batch error must fail every event")
		}
	}
	be := core.NewBatchError(3)
	be.Errs[1] = errors.New("one")
	got := core.EventErrors(be, 3)
	if got[0] != nil || got[1] == nil || got[2] != nil {
		t.Errorf("per-event errors %v", got)
	}
	if core.NewBatchError(2).ErrOrNil() != nil {
		t.Error("a BatchError with no failures is nil")
	}
	if !errors.Is(be, be.Errs[1]) {
		t.Error("errors.Is must see a batch's event errors")
	}
}

func TestTruncateErrorKeepsUTF8(t *testing.T) {
	t.Parallel()
	s := core.TruncateError(errors.New(strings.Repeat("é", 100)), 51)
	if !utf8.ValidString(s) || len(s) > 51+len("…") {
		t.Errorf("truncated to %q", s)
	}
}

type fakeCleaner struct{ left int64 }

func (c *fakeCleaner) DeletePublished(_ context.Context, before time.Time, limit int) (int64, error) {
	n := min(c.left, int64(limit))
	c.left -= n
	return n, nil
}

func TestCleanupInBoundedBatches(t *testing.T) {
	t.Parallel()
	c := &fakeCleaner{left: 25}
	var steps []int64
	n, err := core.Cleanup(t.Context(), c, core.CleanupOptions{BatchSize: 10, OnProgress: func(d int64) { steps = append(steps, d) }})
	if err != nil || n != 25 || len(steps) != 3 || steps[2] != 25 {
		t.Errorf("deleted %d steps %v err %v", n, steps, err)
	}
}

type fixedStats core.Stats

func (s fixedStats) Stats(context.Context) (core.Stats, error) { return core.Stats(s), nil }

func TestMonitorLag(t *testing.T) {
	t.Parallel()
	var called bool
	m, err := core.NewMonitor(fixedStats{Pending: 2, OldestPendingAge: 2 * time.Minute}, core.MonitorOptions{Logger: quiet, OnLag: func(context.Context, core.Stats) { called = true }})
	if err != nil {
		t.Fatal(err)
	}
	if _, lagging, _ := m.Check(t.Context()); !lagging || !called {
		t.Error("2m-old pending event with the default 1m threshold must lag")
	}
	m2, _ := core.NewMonitor(fixedStats{Pending: 2, OldestPendingAge: time.Second}, core.MonitorOptions{Logger: quiet})
	if _, lagging, _ := m2.Check(t.Context()); lagging {
		t.Error("1s is not lagging")
	}
}

// flakyStats fails the checks whose number (from 1) is in failing.
type flakyStats struct {
	mu      sync.Mutex
	checks  int
	failing func(n int) bool
}

func (s *flakyStats) Stats(context.Context) (core.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks++
	if s.failing(s.checks) {
		return core.Stats{}, errors.New("connection refused")
	}
	return core.Stats{}, nil
}

func (s *flakyStats) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checks
}

// An outage of the stats source logs one error when checks start failing
// and one line when they succeed again, while OnError sees every failure.
func TestMonitorLogsFailuresOnce(t *testing.T) {
	t.Parallel()
	// Two outages: checks 2-6 and 9-11.
	src := &flakyStats{failing: func(n int) bool { return (n >= 2 && n <= 6) || (n >= 9 && n <= 11) }}
	var logs logbuf.Buffer
	var failures atomic.Int64
	m, err := core.NewMonitor(src, core.MonitorOptions{Interval: time.Millisecond,
		Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnError: func(context.Context, error) { failures.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	wait.Until(t, "fourteen checks", func() bool { return src.count() >= 14 })
	cancel()
	<-done
	out := logs.String()
	if n := strings.Count(out, "level=ERROR"); n != 2 {
		t.Errorf("%d error lines for two outages, want 2:\n%s", n, out)
	}
	if n := strings.Count(out, "monitor checks succeed again"); n != 2 {
		t.Errorf("%d 'succeed again' lines for two outages, want 2:\n%s", n, out)
	}
	if n := strings.Count(out, "failed_checks=5"); n != 1 {
		t.Errorf("the first outage's end does not count its 5 failed checks:\n%s", out)
	}
	if n := failures.Load(); n != 8 {
		t.Errorf("OnError called %d times for 8 failed checks", n)
	}
}
