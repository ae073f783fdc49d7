// Package metrics exposes an outbox to Prometheus.
//
// It adds no code to the relay: a Metrics value decorates the relay's
// core.Store (claim and mark durations, and, from each Outcome, the
// published / failed / dead-lettered counters by event type and the
// end-to-end lag) and its core.Publisher (publish latency), and its
// ObserveStats method is a core.MonitorOptions.OnStats hook that sets the
// pending, oldest-pending-age and dead gauges and the 0/1 lagging gauge that
// an alerting rule pages on.
//
//	m, _ := metrics.New(metrics.Options{Registerer: reg, LagThreshold: time.Minute})
//	relay, _ := core.NewRelay(m.Store(store), m.Publisher(pub), core.RelayOptions{})
//	mon, _ := core.NewMonitor(store, m.MonitorOptions(core.MonitorOptions{}))
//
// Nothing is registered with the global Prometheus registry unless the
// caller passes prometheus.DefaultRegisterer: libraries that register
// globally make tests and multi-outbox processes collide.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/txoutbox/txoutbox/core"
)

// ErrRegister is wrapped by New when the metrics cannot be registered, most
// often because another Metrics with the same namespace and constant labels
// is already registered with the same registry.
var ErrRegister = errors.New("metrics: register metrics")

// Options configures a Metrics. Zero fields take their defaults.
type Options struct {
	// Registerer, if set, receives the metrics. Nil registers nothing; the
	// Metrics is itself a prometheus.Collector that can be registered later.
	Registerer prometheus.Registerer
	// Namespace prefixes every metric name. Default "txoutbox".
	Namespace string
	// ConstLabels are added to every metric, e.g. {"outbox": "orders"} when
	// one process runs several outboxes.
	ConstLabels prometheus.Labels
	// LagThreshold is the oldest-pending age above which the outbox counts as
	// lagging. It is exported as a gauge so that an alerting rule can compare
	// against the value the process uses, and MonitorOptions passes it to the
	// core.Monitor that logs the warning. Default 1m, as core.Monitor.
	LagThreshold time.Duration
	// PublishBuckets are the buckets (seconds) of the publish, claim and mark
	// duration histograms. Default prometheus.DefBuckets.
	PublishBuckets []float64
	// LagBuckets are the buckets (seconds) of the end-to-end lag histogram.
	// Default 5ms to about 20 minutes, exponential.
	LagBuckets []float64
	// Now is the clock of the lag histogram. Default time.Now.
	Now func() time.Time
}

// Metrics holds the collectors of one outbox. Its methods are safe for
// concurrent use.
type Metrics struct {
	now          func() time.Time
	lagThreshold time.Duration

	published *prometheus.CounterVec
	failed    *prometheus.CounterVec
	dead      *prometheus.CounterVec
	batches   prometheus.Counter
	claimed   prometheus.Counter
	released  prometheus.Counter

	publishDuration *prometheus.HistogramVec
	claimDuration   *prometheus.HistogramVec
	markDuration    *prometheus.HistogramVec
	lag             prometheus.Histogram

	pending          prometheus.Gauge
	oldestPendingAge prometheus.Gauge
	deadEvents       prometheus.Gauge
	scheduled        prometheus.Gauge
	scheduledByType  *prometheus.GaugeVec
	pendingByType    *prometheus.GaugeVec
	oldestByType     *prometheus.GaugeVec
	deadByType       *prometheus.GaugeVec
	threshold        prometheus.Gauge
	lagging          prometheus.Gauge
	statsTime        prometheus.Gauge
	statsFailures    prometheus.Counter

	inboxDuplicates *prometheus.CounterVec

	mu        sync.Mutex
	seenTypes map[string]bool // event types with a per-type gauge set

	collectors []prometheus.Collector
}

// Label values of the result label of the duration histograms.
const (
	resultOK      = "ok"
	resultPartial = "partial" // a *core.BatchError: some events failed
	resultError   = "error"
)

// New returns a Metrics, registered with opts.Registerer when it is set.
func New(opts Options) (*Metrics, error) {
	if opts.LagThreshold < 0 {
		return nil, fmt.Errorf("%w: negative LagThreshold", core.ErrInvalidOptions)
	}
	if opts.Namespace == "" {
		opts.Namespace = "txoutbox"
	}
	if opts.LagThreshold == 0 {
		opts.LagThreshold = time.Minute
	}
	if opts.PublishBuckets == nil {
		opts.PublishBuckets = prometheus.DefBuckets
	}
	if opts.LagBuckets == nil {
		opts.LagBuckets = prometheus.ExponentialBuckets(0.005, 2.5, 14)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	ns, cl := opts.Namespace, opts.ConstLabels
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl}, labels)
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl})
	}
	gaugeVec := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl}, []string{"event_type"})
	}
	duration := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl, Buckets: opts.PublishBuckets}, []string{"result"})
	}
	m := &Metrics{
		now:          opts.Now,
		lagThreshold: opts.LagThreshold,
		published:    counter("events_published_total", "Events the broker accepted and the store marked published, by event type.", "event_type"),
		failed:       counter("events_failed_total", "Failed publish attempts recorded, by event type (dead-lettering attempts included).", "event_type"),
		dead:         counter("events_dead_lettered_total", "Events dead-lettered after their last attempt, by event type.", "event_type"),
		batches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "batches_total",
			Help: "Claims that returned at least one event.", ConstLabels: cl}),
		claimed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "events_claimed_total",
			Help: "Events handed to the relay by claims.", ConstLabels: cl}),
		released: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "events_released_total",
			Help: "Claimed events given back unmarked (a shutdown cut their batch off); they are published again.", ConstLabels: cl}),
		publishDuration: duration("publish_duration_seconds", "Duration of one Publish call of a batch, by result (ok, partial, error)."),
		claimDuration:   duration("claim_duration_seconds", "Duration of one Store.Claim, by result."),
		markDuration:    duration("mark_duration_seconds", "Duration of recording a batch's outcome (Claim.Commit), by result."),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "event_lag_seconds",
			Help:    "End-to-end lag of published events: time marked published minus CreatedAt (a scheduled event's NotBefore).",
			Buckets: opts.LagBuckets, ConstLabels: cl}),
		pending:          gauge("pending_events", "Unpublished, not dead events that are due or in backoff, at the last stats check; scheduled events waiting for their time are not counted."),
		scheduled:        gauge("scheduled_events", "Events scheduled for later (core.Event.NotBefore ahead), at the last stats check; not lag."),
		scheduledByType:  gaugeVec("scheduled_events_by_type", "Events scheduled for later by event type, when the store reports them."),
		oldestPendingAge: gauge("oldest_pending_age_seconds", "Age of the oldest pending event at the last stats check; 0 when none is pending."),
		deadEvents:       gauge("dead_events", "Dead-lettered events, at the last stats check."),
		pendingByType:    gaugeVec("pending_events_by_type", "Pending events by event type, when the store reports them."),
		oldestByType:     gaugeVec("oldest_pending_age_seconds_by_type", "Age of the oldest pending event by event type, when the store reports it."),
		deadByType:       gaugeVec("dead_events_by_type", "Dead-lettered events by event type, when the store reports them."),
		threshold:        gauge("lag_threshold_seconds", "Oldest-pending age above which the outbox counts as lagging."),
		lagging:          gauge("lagging", "1 when the oldest pending event is older than lag_threshold_seconds at the last stats check, else 0."),
		statsTime:        gauge("stats_last_success_timestamp_seconds", "Unix time of the last successful stats check; alert when it stops moving."),
		statsFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "stats_check_failures_total",
			Help: "Stats checks of the monitor that failed (the database unreachable, say); the log has one line per run of failures.", ConstLabels: cl}),
		inboxDuplicates: counter("inbox_duplicates_total", "Deliveries the inbox absorbed because their event was already processed, by consumer.", "consumer"),
		seenTypes:       map[string]bool{},
	}
	m.threshold.Set(opts.LagThreshold.Seconds())
	m.collectors = []prometheus.Collector{
		m.published, m.failed, m.dead, m.batches, m.claimed, m.released,
		m.publishDuration, m.claimDuration, m.markDuration, m.lag,
		m.pending, m.oldestPendingAge, m.deadEvents, m.pendingByType, m.oldestByType, m.deadByType,
		m.scheduled, m.scheduledByType, m.threshold, m.lagging, m.statsTime, m.statsFailures, m.inboxDuplicates,
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(m); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrRegister, err)
		}
	}
	return m, nil
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors {
		c.Collect(ch)
	}
}

// LagThreshold returns the threshold the lagging gauge uses.
func (m *Metrics) LagThreshold() time.Duration { return m.lagThreshold }

// MonitorOptions returns base with LagThreshold set to the Metrics' threshold,
// OnStats extended to call ObserveStats, so that the monitor's warning log
// and the lagging gauge never disagree, and OnError extended to count failed
// checks (stats_check_failures_total).
func (m *Metrics) MonitorOptions(base core.MonitorOptions) core.MonitorOptions {
	base.LagThreshold = m.lagThreshold
	prevStats, prevErr := base.OnStats, base.OnError
	base.OnStats = func(ctx context.Context, s core.Stats) {
		m.ObserveStats(ctx, s)
		if prevStats != nil {
			prevStats(ctx, s)
		}
	}
	base.OnError = func(ctx context.Context, err error) {
		m.statsFailures.Inc()
		if prevErr != nil {
			prevErr(ctx, err)
		}
	}
	return base
}

// ObserveStats sets the gauges from a stats snapshot. It has the signature
// of core.MonitorOptions.OnStats. The lagging rule is core.Monitor's:
// something is pending and the oldest pending event is older than the
// threshold.
func (m *Metrics) ObserveStats(_ context.Context, s core.Stats) {
	m.pending.Set(float64(s.Pending))
	m.oldestPendingAge.Set(s.OldestPendingAge.Seconds())
	m.deadEvents.Set(float64(s.Dead))
	m.scheduled.Set(float64(s.Scheduled))
	if s.Pending > 0 && s.OldestPendingAge > m.lagThreshold {
		m.lagging.Set(1)
	} else {
		m.lagging.Set(0)
	}
	m.statsTime.Set(float64(m.now().UnixNano()) / 1e9)

	m.mu.Lock()
	defer m.mu.Unlock()
	// A type that drained since the last check drops out of ByType; set it to
	// zero rather than deleting it so that its series does not end on the
	// last non-zero value (which a "pending > 0 for 10m" rule would see).
	for t := range m.seenTypes {
		if _, ok := s.ByType[t]; !ok {
			m.pendingByType.WithLabelValues(t).Set(0)
			m.oldestByType.WithLabelValues(t).Set(0)
			m.deadByType.WithLabelValues(t).Set(0)
			m.scheduledByType.WithLabelValues(t).Set(0)
		}
	}
	for t, ts := range s.ByType {
		m.seenTypes[t] = true
		m.pendingByType.WithLabelValues(t).Set(float64(ts.Pending))
		m.oldestByType.WithLabelValues(t).Set(ts.OldestPendingAge.Seconds())
		m.deadByType.WithLabelValues(t).Set(float64(ts.Dead))
		m.scheduledByType.WithLabelValues(t).Set(float64(ts.Scheduled))
	}
}

// InboxDuplicate counts a delivery the inbox absorbed. It has the signature
// of inbox.Options.OnDuplicate:
//
//	mw, _ := inbox.NewMiddleware(ib, inbox.Options{Consumer: "billing", OnDuplicate: m.InboxDuplicate})
func (m *Metrics) InboxDuplicate(_ context.Context, consumer, _ string) {
	m.inboxDuplicates.WithLabelValues(consumer).Inc()
}

func result(err error) string {
	if err == nil {
		return resultOK
	}
	var be *core.BatchError
	if errors.As(err, &be) {
		return resultPartial
	}
	return resultError
}

// Publisher returns p decorated with the publish latency histogram. The
// counters by event type come from the Store decorator, which sees what the
// relay records, not from here: a publish whose outcome is never recorded
// (shutdown cut it off, or the mark failed) is published again.
func (m *Metrics) Publisher(p core.Publisher) core.Publisher { return &publisher{inner: p, m: m} }

type publisher struct {
	inner core.Publisher
	m     *Metrics
}

// Unwrap implements core.PublisherWrapper.
func (p *publisher) Unwrap() core.Publisher { return p.inner }

func (p *publisher) Publish(ctx context.Context, events []core.Event) error {
	start := time.Now()
	err := p.inner.Publish(ctx, events)
	p.m.publishDuration.WithLabelValues(result(err)).Observe(time.Since(start).Seconds())
	return err
}

// Capabilities forwards the decorated publisher's: metrics change none.
func (p *publisher) Capabilities() core.PublisherCapabilities { return p.inner.Capabilities() }

// Store returns s decorated with the claim and mark histograms and the event
// counters. Capabilities pass through, and the decorated store unwraps to
// s (core.StoreWrapper), so that a relay on it finds all that s can do; read
// Stats from s and clean up with s.
func (m *Metrics) Store(s core.Store) core.Store { return &store{inner: s, m: m} }

type store struct {
	inner core.Store
	m     *Metrics
}

func (s *store) Capabilities() core.StoreCapabilities { return s.inner.Capabilities() }

// Unwrap implements core.StoreWrapper: the relay finds the wrapped store's
// optional interfaces (its wake-up signal, its leaser) there.
func (s *store) Unwrap() core.Store { return s.inner }

func (s *store) Claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	start := time.Now()
	c, err := s.inner.Claim(ctx, req)
	s.m.claimDuration.WithLabelValues(result(err)).Observe(time.Since(start).Seconds())
	if err != nil {
		return nil, err
	}
	if n := len(c.Events()); n > 0 {
		s.m.batches.Inc()
		s.m.claimed.Add(float64(n))
	}
	return &claim{Claim: c, m: s.m}, nil
}

type claim struct {
	core.Claim
	m *Metrics
}

// Release counts the events given back: the relay releases a non-empty
// claim only when a shutdown cut its batch off.
func (c *claim) Release(ctx context.Context) error {
	err := c.Claim.Release(ctx)
	if err == nil {
		c.m.released.Add(float64(len(c.Claim.Events())))
	}
	return err
}

// Commit records the outcome, then counts it: only an outcome the store
// accepted moves the counters, so they agree with the database.
func (c *claim) Commit(ctx context.Context, out core.Outcome) error {
	start := time.Now()
	err := c.Claim.Commit(ctx, out)
	c.m.markDuration.WithLabelValues(result(err)).Observe(time.Since(start).Seconds())
	if err != nil {
		return err
	}
	events := c.Claim.Events()
	bySeq := make(map[int64]*core.Event, len(events))
	for i := range events {
		bySeq[events[i].Seq] = &events[i]
	}
	now := c.m.now()
	for _, seq := range out.Published {
		ev, ok := bySeq[seq]
		if !ok {
			continue // not ours; the store ignores it too
		}
		c.m.published.WithLabelValues(ev.EventType).Inc()
		if !ev.CreatedAt.IsZero() {
			// CreatedAt is the database's clock; a skewed relay clock must
			// not produce negative observations.
			// A scheduled event's lag runs from its time, not its writing.
			due := ev.CreatedAt
			if ev.AttemptCount == 0 && ev.NextAttemptAt.After(due) {
				due = ev.NextAttemptAt
			}
			c.m.lag.Observe(max(now.Sub(due), 0).Seconds())
		}
	}
	for _, f := range out.Failed {
		ev, ok := bySeq[f.Seq]
		if !ok {
			continue
		}
		c.m.failed.WithLabelValues(ev.EventType).Inc()
		if f.Dead {
			c.m.dead.WithLabelValues(ev.EventType).Inc()
		}
	}
	return nil
}
