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

// Cleaner is implemented by inboxes that can delete old records: *SQL and
// *gorminbox.Inbox.
type Cleaner interface {
	// DeleteProcessed deletes at most limit records processed before the
	// given time and returns how many it deleted.
	DeleteProcessed(ctx context.Context, before time.Time, limit int) (int64, error)
}

// asCoreCleaner lets core.Cleanup drive an inbox: same batching, same
// pauses, same progress reports as the outbox's retention.
type asCoreCleaner struct{ c Cleaner }

func (a asCoreCleaner) DeletePublished(ctx context.Context, before time.Time, limit int) (int64, error) {
	return a.c.DeleteProcessed(ctx, before, limit)
}

func cleanupDefaults(opts core.CleanupOptions) core.CleanupOptions {
	if opts.Retention == 0 {
		opts.Retention = DefaultRetention
	}
	return opts
}

// Cleanup deletes records processed more than opts.Retention ago (default
// DefaultRetention, not core's 30 days), in batches of opts.BatchSize
// (default 1000) so that no DELETE holds locks for long, and returns how
// many it deleted. An event redelivered after its record was deleted takes
// effect again: keep Retention longer than any redelivery or replay window.
func Cleanup(ctx context.Context, c Cleaner, opts core.CleanupOptions) (int64, error) {
	if c == nil {
		return 0, fmt.Errorf("%w: inbox.Cleanup needs a Cleaner", core.ErrInvalidOptions)
	}
	n, err := core.Cleanup(ctx, asCoreCleaner{c}, cleanupDefaults(opts))
	if err != nil {
		return n, fmt.Errorf("inbox: %w", err)
	}
	return n, nil
}

// RunCleanup runs Cleanup every opts.Interval (default 1h) until ctx is
// cancelled. Errors are logged and the next pass tries again; it returns an
// error only for invalid options.
func RunCleanup(ctx context.Context, c Cleaner, opts core.CleanupOptions) error {
	if c == nil {
		return fmt.Errorf("%w: inbox.RunCleanup needs a Cleaner", core.ErrInvalidOptions)
	}
	opts = cleanupDefaults(opts)
	if opts.Interval < 0 {
		return fmt.Errorf("%w: negative cleanup Interval", core.ErrInvalidOptions)
	}
	if opts.Interval == 0 {
		opts.Interval = time.Hour
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	// Validate once up front, so that bad options fail the caller rather
	// than filling the log every interval.
	if _, err := core.Cleanup(ctx, noopCleaner{}, opts); err != nil {
		return err
	}
	t := time.NewTicker(opts.Interval)
	defer t.Stop()
	for {
		n, err := Cleanup(ctx, c, opts)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			log.Error("txoutbox: inbox cleanup failed", "deleted", n, "error", err)
		} else if n > 0 {
			log.Info("txoutbox: inbox cleanup deleted processed records", "deleted", n, "retention", opts.Retention)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

type noopCleaner struct{}

func (noopCleaner) DeletePublished(context.Context, time.Time, int) (int64, error) { return 0, nil }
