package metrics_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	memoutbox "github.com/txoutbox/txoutbox/adapters/memory"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/metrics"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// memStore is the reference in-memory store holding events, committed,
// with their CreatedAt kept as given (for the lag histogram); commitErr,
// when set, fails every claim's Commit.
type memStore struct {
	*memoutbox.Store
	commitErr error
}

func newMemStore(events ...core.Event) *memStore {
	s := &memStore{Store: memoutbox.New(memoutbox.Options{})}
	if len(events) == 0 {
		return s
	}
	ctx := context.Background()
	tx := s.Begin()
	if err := s.Enqueue(ctx, tx, events...); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
	for _, ev := range events {
		if !ev.CreatedAt.IsZero() {
			if err := s.Backdate(ctx, ev.ID, time.Since(ev.CreatedAt)); err != nil {
				panic(err)
			}
		}
	}
	return s
}

func (s *memStore) Claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	c, err := s.Store.Claim(ctx, req)
	if err != nil || s.commitErr == nil {
		return c, err
	}
	return failingCommit{c, s.commitErr}, nil
}

// failingCommit releases the claim and reports err, as a store whose
// connection dropped at the mark does.
type failingCommit struct {
	core.Claim
	err error
}

func (c failingCommit) Commit(ctx context.Context, _ core.Outcome) error {
	if err := c.Claim.Release(ctx); err != nil {
		return err
	}
	return c.err
}

type limitedMemStore struct{ *memStore }

func (limitedMemStore) Capabilities() core.StoreCapabilities {
	return core.StoreCapabilities{MaxConcurrency: 1}
}

// quiet keeps the relay's expected warnings out of the test output.
var quiet = slog.New(slog.DiscardHandler)

var errBroker = errors.New("broker refused")

// failTypes fails every event whose type is in types.
func failTypes(types ...string) core.Publisher {
	return core.PublisherFunc(func(_ context.Context, events []core.Event) error {
		be := core.NewBatchError(len(events))
		for i, ev := range events {
			for _, t := range types {
				if ev.EventType == t {
					be.Errs[i] = errBroker
				}
			}
		}
		return be.ErrOrNil()
	})
}

func events(eventType string, n int, age time.Duration) []core.Event {
	evs := make([]core.Event, n)
	for i := range evs {
		evs[i] = core.Event{EventType: eventType, AggregateID: "a", CreatedAt: time.Now().Add(-age), Payload: []byte("{}")}
	}
	return evs
}

func TestCountersByEventTypeFromOutcome(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	evs := append(events("order.created", 5, 3*time.Second), events("order.paid", 3, 0)...)
	st := newMemStore(evs...)
	relay, err := core.NewRelay(m.Store(st), m.Publisher(failTypes("order.paid")), core.RelayOptions{
		BatchSize: 4,
		Retry:     core.RetryPolicy{MaxAttempts: 1},
		Logger:    quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := relay.Drain(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Published != 5 || res.DeadLettered != 3 {
		t.Fatalf("drain: %+v", res)
	}
	want := `
# HELP txoutbox_events_dead_lettered_total Events dead-lettered after their last attempt, by event type.
# TYPE txoutbox_events_dead_lettered_total counter
txoutbox_events_dead_lettered_total{event_type="order.paid"} 3
# HELP txoutbox_events_failed_total Failed publish attempts recorded, by event type (dead-lettering attempts included).
# TYPE txoutbox_events_failed_total counter
txoutbox_events_failed_total{event_type="order.paid"} 3
# HELP txoutbox_events_published_total Events the broker accepted and the store marked published, by event type.
# TYPE txoutbox_events_published_total counter
txoutbox_events_published_total{event_type="order.created"} 5
# HELP txoutbox_events_claimed_total Events handed to the relay by claims.
# TYPE txoutbox_events_claimed_total counter
txoutbox_events_claimed_total 8
# HELP txoutbox_batches_total Claims that returned at least one event.
# TYPE txoutbox_batches_total counter
txoutbox_batches_total 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"txoutbox_events_dead_lettered_total", "txoutbox_events_failed_total", "txoutbox_events_published_total",
		"txoutbox_events_claimed_total", "txoutbox_batches_total"); err != nil {
		t.Fatal(err)
	}
	// Three claims (two batches and the empty one that ends Drain), two
	// publishes (the first all order.created, the second partial), two marks.
	for name, n := range map[string]int{
		"txoutbox_claim_duration_seconds":   1, // one series: result="ok"
		"txoutbox_publish_duration_seconds": 2, // result="ok" and "partial"
		"txoutbox_mark_duration_seconds":    1,
	} {
		if got, err := testutil.GatherAndCount(reg, name); err != nil || got != n {
			t.Errorf("%s: %d series, err %v; want %d", name, got, err, n)
		}
	}
	assertHistogram(t, reg, "txoutbox_claim_duration_seconds", map[string]string{"result": "ok"}, 3, 0)
	assertHistogram(t, reg, "txoutbox_publish_duration_seconds", map[string]string{"result": "ok"}, 1, 0)
	assertHistogram(t, reg, "txoutbox_publish_duration_seconds", map[string]string{"result": "partial"}, 1, 0)
	assertHistogram(t, reg, "txoutbox_mark_duration_seconds", map[string]string{"result": "ok"}, 2, 0)
	// Lag: five published events created 3s ago.
	assertHistogram(t, reg, "txoutbox_event_lag_seconds", nil, 5, 5*3)
}

// assertHistogram checks the sample count and (when minSum > 0) that the sum
// is at least minSum.
func assertHistogram(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string, count uint64, minSum float64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, metric := range mf.GetMetric() {
			for _, lp := range metric.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			h := metric.GetHistogram()
			if h.GetSampleCount() != count {
				t.Errorf("%s%v: %d samples, want %d", name, labels, h.GetSampleCount(), count)
			}
			if h.GetSampleSum() < minSum {
				t.Errorf("%s%v: sum %v, want >= %v", name, labels, h.GetSampleSum(), minSum)
			}
			return
		}
	}
	t.Errorf("%s%v: no such histogram", name, labels)
}

func TestFailedMarkCountsNothing(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(metrics.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	st := newMemStore(events("x", 2, 0)...)
	st.commitErr = errors.New("connection reset")
	relay, err := core.NewRelay(m.Store(st), m.Publisher(failTypes()), core.RelayOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.ProcessBatch(context.Background()); !errors.Is(err, st.commitErr) {
		t.Fatalf("ProcessBatch: %v, want the commit error", err)
	}
	if n := testutil.CollectAndCount(m, "txoutbox_events_published_total"); n != 0 {
		t.Fatalf("published counter has %d series after a failed mark; the batch will be published again", n)
	}
	assertHistogram(t, reg, "txoutbox_mark_duration_seconds", map[string]string{"result": "error"}, 1, 0)
}

func TestWholeBatchErrorIsLabelledError(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(metrics.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	down := core.PublisherFunc(func(context.Context, []core.Event) error { return errBroker })
	relay, err := core.NewRelay(m.Store(newMemStore(events("x", 2, 0)...)), m.Publisher(down), core.RelayOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.ProcessBatch(context.Background()); err != nil {
		t.Fatal(err)
	}
	assertHistogram(t, reg, "txoutbox_publish_duration_seconds", map[string]string{"result": "error"}, 1, 0)
	if got := value(t, reg, "txoutbox_events_failed_total"); got != 2 {
		t.Fatalf("failed = %v, want 2", got)
	}
	if n := testutil.CollectAndCount(m, "txoutbox_events_dead_lettered_total"); n != 0 {
		t.Fatalf("dead counter moved on a first failure")
	}
}

// value returns the value of the single series of a counter or gauge.
func value(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("%s: not exactly one series", name)
	return 0
}

func TestStoreKeepsConcurrencyLimit(t *testing.T) {
	m, err := metrics.New(metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	wrapped := m.Store(limitedMemStore{newMemStore()})
	if got := wrapped.Capabilities().MaxConcurrency; got != 1 {
		t.Fatalf("limit lost by the decorator: MaxConcurrency %d", got)
	}
	relay, err := core.NewRelay(wrapped, failTypes(), core.RelayOptions{Concurrency: 4, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if c := relay.Options().Concurrency; c != 1 {
		t.Fatalf("relay concurrency %d, want capped to 1", c)
	}
}

type statsFunc func(context.Context) (core.Stats, error)

func (f statsFunc) Stats(ctx context.Context) (core.Stats, error) { return f(ctx) }

func TestGaugesAndLaggingFromMonitor(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(metrics.Options{Registerer: reg, LagThreshold: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	stats := core.Stats{
		Pending: 7, OldestPendingAge: 45 * time.Second, Dead: 2, Scheduled: 3,
		ByType: map[string]core.TypeStats{
			"order.created": {Pending: 5, OldestPendingAge: 45 * time.Second, Scheduled: 3},
			"order.paid":    {Pending: 2, OldestPendingAge: time.Second, Dead: 2},
		},
	}
	var userHook int
	mon, err := core.NewMonitor(statsFunc(func(context.Context) (core.Stats, error) {
		mu.Lock()
		defer mu.Unlock()
		return stats, nil
	}), m.MonitorOptions(core.MonitorOptions{Logger: quiet, OnStats: func(context.Context, core.Stats) { userHook++ }}))
	if err != nil {
		t.Fatal(err)
	}
	_, lagging, err := mon.Check(context.Background())
	if err != nil || !lagging {
		t.Fatalf("Check: lagging %v, err %v; want lagging (45s > 30s)", lagging, err)
	}
	if userHook != 1 {
		t.Fatalf("the caller's OnStats ran %d times, want 1", userHook)
	}
	want := `
# HELP txoutbox_lag_threshold_seconds Oldest-pending age above which the outbox counts as lagging.
# TYPE txoutbox_lag_threshold_seconds gauge
txoutbox_lag_threshold_seconds 30
# HELP txoutbox_lagging 1 when the oldest pending event is older than lag_threshold_seconds at the last stats check, else 0.
# TYPE txoutbox_lagging gauge
txoutbox_lagging 1
# HELP txoutbox_pending_events Unpublished, not dead events that are due or in backoff, at the last stats check; scheduled events waiting for their time are not counted.
# TYPE txoutbox_pending_events gauge
txoutbox_pending_events 7
# HELP txoutbox_oldest_pending_age_seconds Age of the oldest pending event at the last stats check; 0 when none is pending.
# TYPE txoutbox_oldest_pending_age_seconds gauge
txoutbox_oldest_pending_age_seconds 45
# HELP txoutbox_dead_events Dead-lettered events, at the last stats check.
# TYPE txoutbox_dead_events gauge
txoutbox_dead_events 2
# HELP txoutbox_pending_events_by_type Pending events by event type, when the store reports them.
# TYPE txoutbox_pending_events_by_type gauge
txoutbox_pending_events_by_type{event_type="order.created"} 5
txoutbox_pending_events_by_type{event_type="order.paid"} 2
# HELP txoutbox_dead_events_by_type Dead-lettered events by event type, when the store reports them.
# TYPE txoutbox_dead_events_by_type gauge
txoutbox_dead_events_by_type{event_type="order.created"} 0
txoutbox_dead_events_by_type{event_type="order.paid"} 2
# HELP txoutbox_scheduled_events Events scheduled for later (core.Event.NotBefore ahead), at the last stats check; not lag.
# TYPE txoutbox_scheduled_events gauge
txoutbox_scheduled_events 3
# HELP txoutbox_scheduled_events_by_type Events scheduled for later by event type, when the store reports them.
# TYPE txoutbox_scheduled_events_by_type gauge
txoutbox_scheduled_events_by_type{event_type="order.created"} 3
txoutbox_scheduled_events_by_type{event_type="order.paid"} 0
`
	names := []string{"txoutbox_lag_threshold_seconds", "txoutbox_lagging", "txoutbox_pending_events",
		"txoutbox_oldest_pending_age_seconds", "txoutbox_dead_events", "txoutbox_pending_events_by_type", "txoutbox_dead_events_by_type",
		"txoutbox_scheduled_events", "txoutbox_scheduled_events_by_type"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}

	// The relay caught up: order.created drained and left ByType.
	mu.Lock()
	stats = core.Stats{Dead: 2, ByType: map[string]core.TypeStats{"order.paid": {Dead: 2}}}
	mu.Unlock()
	if _, lagging, err := mon.Check(context.Background()); err != nil || lagging {
		t.Fatalf("Check: lagging %v, err %v; want not lagging", lagging, err)
	}
	if got := value(t, reg, "txoutbox_lagging"); got != 0 {
		t.Fatalf("lagging gauge %v after catching up", got)
	}
	want = `
# HELP txoutbox_pending_events_by_type Pending events by event type, when the store reports them.
# TYPE txoutbox_pending_events_by_type gauge
txoutbox_pending_events_by_type{event_type="order.created"} 0
txoutbox_pending_events_by_type{event_type="order.paid"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "txoutbox_pending_events_by_type"); err != nil {
		t.Fatal(err)
	}
}

func TestRegistryIsInjectedNotGlobal(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := metrics.New(metrics.Options{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.New(metrics.Options{Registerer: reg}); !errors.Is(err, metrics.ErrRegister) {
		t.Fatalf("second registration: %v, want ErrRegister", err)
	}
	// Two outboxes in one registry, told apart by a constant label.
	reg2 := prometheus.NewRegistry()
	for _, name := range []string{"orders", "billing"} {
		if _, err := metrics.New(metrics.Options{Registerer: reg2, ConstLabels: prometheus.Labels{"outbox": name}}); err != nil {
			t.Fatalf("outbox %s with its own label: %v", name, err)
		}
	}
	// Nothing went to the default registry.
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "txoutbox_") {
			t.Fatalf("%s registered globally", mf.GetName())
		}
	}
	if _, err := metrics.New(metrics.Options{LagThreshold: -time.Second}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Fatalf("negative threshold: %v", err)
	}
}

// The relay decides from the capabilities of what it is given; a decorator
// must forward all of them, and Stats and DeletePublished too.
func TestDecoratorsKeepCapabilities(t *testing.T) {
	m, err := metrics.New(metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	outboxtest.RequireStoreDecorator(t, m.Store)
	outboxtest.RequirePublisherDecorator(t, m.Publisher)
}

func TestReleasedEventsCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(metrics.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	st := m.Store(newMemStore(events("x", 3, 0)...))
	c, err := st.Claim(context.Background(), core.ClaimRequest{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(context.Background()); !errors.Is(err, core.ErrClaimDone) {
		t.Fatalf("second Release: %v", err)
	}
	if got := value(t, reg, "txoutbox_events_released_total"); got != 3 {
		t.Fatalf("released = %v, want 3 (the second Release gave nothing back)", got)
	}
}

// The inbox reports every duplicate it absorbs through OnDuplicate, which
// InboxDuplicate counts by consumer.
func TestInboxDuplicatesCounted(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	var hook func(context.Context, string, string) = m.InboxDuplicate // inbox.Options.OnDuplicate's type
	hook(context.Background(), "billing", "e-1")
	hook(context.Background(), "billing", "e-2")
	hook(context.Background(), "mailer", "e-1")
	if got := testutil.ToFloat64(counterOf(t, reg, "txoutbox_inbox_duplicates_total", "billing")); got != 2 {
		t.Fatalf("billing duplicates = %v, want 2", got)
	}
}

func counterOf(t *testing.T, reg *prometheus.Registry, name, consumer string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "consumer" && lp.GetValue() == consumer {
					return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x", Help: "x"}, func() float64 { return mt.GetCounter().GetValue() })
				}
			}
		}
	}
	t.Fatalf("no %s{consumer=%q}", name, consumer)
	return nil
}

// Failed checks of a monitor run count in stats_check_failures_total, and
// the caller's own OnError still runs.
func TestStatsCheckFailuresCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(metrics.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	checks, userHook := 0, 0
	src := statsFunc(func(context.Context) (core.Stats, error) {
		mu.Lock()
		defer mu.Unlock()
		checks++
		if checks <= 3 {
			return core.Stats{}, errors.New("connection refused")
		}
		return core.Stats{}, nil
	})
	mon, err := core.NewMonitor(src, m.MonitorOptions(core.MonitorOptions{Logger: quiet, Interval: time.Millisecond,
		OnError: func(context.Context, error) { mu.Lock(); userHook++; mu.Unlock() }}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- mon.Run(ctx) }()
	wait.For(t, "the monitor's fifth check", func() (bool, any) {
		mu.Lock()
		defer mu.Unlock()
		return checks >= 5, checks
	})
	cancel()
	<-done
	if got := value(t, reg, "txoutbox_stats_check_failures_total"); got != 3 {
		t.Errorf("stats_check_failures_total %v, want 3", got)
	}
	if userHook != 3 {
		t.Errorf("the caller's OnError ran %d times, want 3", userHook)
	}
}
