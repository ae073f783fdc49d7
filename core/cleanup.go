package core

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// MaxCleanupBatchSize bounds CleanupOptions.BatchSize: one DELETE of more
// rows holds its locks, and writes its WAL, for too long.
const MaxCleanupBatchSize = 100_000

// CleanupOptions configures retention of published events.
type CleanupOptions struct {
	// Retention is how long published events are kept (for audit and
	// replay). Default 30 days.
	Retention time.Duration
	// BatchSize bounds each DELETE so that no statement holds locks for
	// long. Default 1000.
	BatchSize int
	// Pause is slept between batches to leave the database to the writers.
	// Default 0.
	Pause time.Duration
	// Interval is how often RunCleanup runs a pass. Default 1h.
	Interval time.Duration
	// OnProgress, if set, is called after each batch with the running total.
	OnProgress func(deleted int64)
	// Logger receives the results of RunCleanup. Default slog.Default().
	Logger *slog.Logger
}

func (o CleanupOptions) withDefaults() (CleanupOptions, error) {
	if o.Retention < 0 || o.BatchSize < 0 || o.Pause < 0 || o.Interval < 0 {
		return o, fmt.Errorf("%w: negative cleanup option", ErrInvalidOptions)
	}
	if o.BatchSize > MaxCleanupBatchSize {
		return o, fmt.Errorf("%w: cleanup BatchSize %d is above the limit of %d", ErrInvalidOptions, o.BatchSize, MaxCleanupBatchSize)
	}
	if o.Retention == 0 {
		o.Retention = 30 * 24 * time.Hour
	}
	if o.BatchSize == 0 {
		o.BatchSize = 1000
	}
	if o.Interval == 0 {
		o.Interval = time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// Cleanup deletes events published more than Retention ago, in batches of
// BatchSize until none is left, and returns how many it deleted. Pending and
// dead-lettered events are never deleted.
func Cleanup(ctx context.Context, c Cleaner, opts CleanupOptions) (int64, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return 0, err
	}
	before := time.Now().Add(-o.Retention)
	var total int64
	for {
		n, err := c.DeletePublished(ctx, before, o.BatchSize)
		total += n
		if err != nil {
			return total, fmt.Errorf("txoutbox: cleanup after %d deleted: %w", total, err)
		}
		if n > 0 && o.OnProgress != nil {
			o.OnProgress(total)
		}
		if n < int64(o.BatchSize) {
			return total, nil
		}
		if o.Pause > 0 {
			select {
			case <-ctx.Done():
				return total, ctx.Err()
			case <-time.After(o.Pause):
			}
		}
	}
}

// RunCleanup runs Cleanup every Interval until ctx is cancelled. Errors are
// logged, not returned: the next pass tries again.
func RunCleanup(ctx context.Context, c Cleaner, opts CleanupOptions) error {
	o, err := opts.withDefaults()
	if err != nil {
		return err
	}
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	for {
		n, err := Cleanup(ctx, c, o)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			o.Logger.Error("txoutbox: cleanup failed", "deleted", n, "error", err)
		} else if n > 0 {
			o.Logger.Info("txoutbox: cleanup deleted rows past their retention", "deleted", n, "retention", o.Retention)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
