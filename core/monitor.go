package core

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// MonitorOptions configures a Monitor.
type MonitorOptions struct {
	// Interval between checks. Default 15s.
	Interval time.Duration
	// LagThreshold is the age of the oldest pending event above which the
	// outbox counts as lagging. Default 1m.
	LagThreshold time.Duration
	// OnLag is called on every check that finds the outbox lagging. The
	// monitor also logs a warning.
	OnLag func(ctx context.Context, s Stats)
	// OnStats is called after every successful check, e.g. to set gauges.
	OnStats func(ctx context.Context, s Stats)
	// OnError is called after every failed check of Run, e.g. to count
	// failures; Run itself logs only the first of a run of failures and
	// the check that ends it.
	OnError func(ctx context.Context, err error)
	// Logger receives warnings. Default slog.Default().
	Logger *slog.Logger
}

// Monitor watches an outbox for events that wait too long to be published,
// which means the relay is down, stuck or too slow.
type Monitor struct {
	src  StatsReader
	opts MonitorOptions
}

// NewMonitor returns a monitor reading from src.
func NewMonitor(src StatsReader, opts MonitorOptions) (*Monitor, error) {
	if src == nil {
		return nil, fmt.Errorf("%w: NewMonitor needs a StatsReader", ErrInvalidOptions)
	}
	if opts.Interval < 0 || opts.LagThreshold < 0 {
		return nil, fmt.Errorf("%w: negative Interval or LagThreshold", ErrInvalidOptions)
	}
	if opts.Interval == 0 {
		opts.Interval = 15 * time.Second
	}
	if opts.LagThreshold == 0 {
		opts.LagThreshold = time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Monitor{src: src, opts: opts}, nil
}

// Check reads the stats once and reports whether the outbox is lagging,
// calling OnStats and OnLag as configured.
func (m *Monitor) Check(ctx context.Context) (Stats, bool, error) {
	s, err := m.src.Stats(ctx)
	if err != nil {
		return s, false, fmt.Errorf("txoutbox: read outbox stats: %w", err)
	}
	if m.opts.OnStats != nil {
		m.opts.OnStats(ctx, s)
	}
	lagging := s.Pending > 0 && s.OldestPendingAge > m.opts.LagThreshold
	if lagging {
		m.opts.Logger.Warn("txoutbox: outbox is lagging",
			"oldest_pending_age", s.OldestPendingAge, "threshold", m.opts.LagThreshold,
			"pending", s.Pending, "dead", s.Dead)
		if m.opts.OnLag != nil {
			m.opts.OnLag(ctx, s)
		}
	}
	return s, lagging, nil
}

// Run checks every Interval until ctx is cancelled. A failed check is
// retried at the next tick. An outage of the database logs two lines, one
// error when checks start failing and one when they succeed again, not one
// per Interval; the failures in between go to OnError and the debug log.
func (m *Monitor) Run(ctx context.Context) error {
	t := time.NewTicker(m.opts.Interval)
	defer t.Stop()
	var failing time.Time // when the current run of failures began
	failures := 0
	for {
		_, _, err := m.Check(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			failures++
			if m.opts.OnError != nil {
				m.opts.OnError(ctx, err)
			}
			if failures == 1 {
				failing = time.Now()
				m.opts.Logger.Error("txoutbox: monitor check failed; retrying every interval (logged once until a check succeeds)",
					"error", err, "interval", m.opts.Interval)
			} else {
				m.opts.Logger.Debug("txoutbox: monitor check failed again", "error", err)
			}
		case failures > 0:
			m.opts.Logger.Info("txoutbox: monitor checks succeed again",
				"after", time.Since(failing).Round(time.Millisecond), "failed_checks", failures)
			failures = 0
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
