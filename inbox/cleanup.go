package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// DefaultRetention is how long Cleanup keeps inbox records by default: longer
// than the outbox keeps published events (30 days by default), so that no
// event the relay could still re-publish (a re-queued dead letter, a replay
// from the outbox) finds its record gone and takes effect a second time.
const DefaultRetention = 45 * 24 * time.Hour

// Cleaner is implemented by inboxes that can delete old records:
// *sqlinbox.Inbox and *gorminbox.Inbox.
type Cleaner interface {
	// DeleteProcessed deletes at most limit records processed before the
	// given time and returns how many it deleted.
	DeleteProcessed(ctx context.Context, before time.Time, limit int) (int64, error)
}

// CleanupOptions configures Cleanup and RunCleanup. Zero fields take their
// defaults; negative ones are refused.
type CleanupOptions struct {
	// Retention is how long records are kept. Default DefaultRetention.
	// An event redelivered after its record was deleted takes effect
	// again: keep it longer than any redelivery or replay window.
	Retention time.Duration
	// BatchSize bounds each DELETE so that no statement holds locks for
	// long. Default 1000.
	BatchSize int
	// Pause is slept between batches. Default 0.
	Pause time.Duration
	// Interval is how often RunCleanup runs a pass. Default 1h.
	Interval time.Duration
	// OnProgress, if set, is called after each batch with the running
	// total.
	OnProgress func(deleted int64)
	// Logger receives RunCleanup's results. Default slog.Default().
	Logger *slog.Logger
}

// core returns the options as core.Cleanup takes them, with the inbox's
// defaults.
func (o CleanupOptions) core() core.CleanupOptions {
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	return core.CleanupOptions{
		Retention: o.Retention, BatchSize: o.BatchSize, Pause: o.Pause, Interval: o.Interval,
		OnProgress: o.OnProgress, Logger: o.Logger,
	}
}

// asCoreCleaner lets core.Cleanup drive an inbox: same batching, same
// pauses, same progress reports as the outbox's retention.
type asCoreCleaner struct{ c Cleaner }

func (a asCoreCleaner) DeletePublished(ctx context.Context, before time.Time, limit int) (int64, error) {
	return a.c.DeleteProcessed(ctx, before, limit)
}

// Cleanup deletes records processed more than opts.Retention ago, in
// batches of opts.BatchSize, and returns how many it deleted.
func Cleanup(ctx context.Context, c Cleaner, opts CleanupOptions) (int64, error) {
	if c == nil {
		return 0, fmt.Errorf("%w: inbox.Cleanup needs a Cleaner", core.ErrInvalidOptions)
	}
	n, err := core.Cleanup(ctx, asCoreCleaner{c}, opts.core())
	if err != nil {
		return n, fmt.Errorf("inbox: %w", err)
	}
	return n, nil
}

// RunCleanup runs Cleanup every opts.Interval until ctx is cancelled.
// Errors are logged and the next pass tries again; it returns an error only
// for invalid options, before the first pass.
func RunCleanup(ctx context.Context, c Cleaner, opts CleanupOptions) error {
	if c == nil {
		return fmt.Errorf("%w: inbox.RunCleanup needs a Cleaner", core.ErrInvalidOptions)
	}
	return core.RunCleanup(ctx, asCoreCleaner{c}, opts.core())
}
