package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

func (a *app) cleanupCommand() *cobra.Command {
	var (
		retention, pause time.Duration
		batchSize        int
		quiet            bool
		partitioned      bool
		ahead            int
	)
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Delete published events older than the retention, now",
		Long: `cleanup deletes events published more than --retention ago, in batches of
--batch-size so that no statement holds locks for long, sleeping --pause between
batches to leave the database to the writers. Pending and dead-lettered events
are never deleted. Progress is printed on stderr after each batch.

Published events are kept for audit and 'txoutbox replay'; what cleanup deleted
can no longer be replayed. The relay can run the same cleanup periodically
(relay --cleanup-interval).

For a table made by 'migrate --partitioned', pass --partitioned: cleanup then
creates the daily partitions ahead and drops the partitions whose events were
all published before the retention; a partition still holding a pending or
dead event is kept.`,
		Example: `  txoutbox cleanup                         # keep 30 days
  txoutbox cleanup --retention 168h        # keep a week
  txoutbox cleanup --batch-size 5000 --pause 100ms
  txoutbox cleanup --partitioned --retention 168h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if retention <= 0 || batchSize < 1 || batchSize > core.MaxCleanupBatchSize || pause < 0 {
				return usagef("--retention must be positive, --batch-size from 1 to %d, --pause not negative", core.MaxCleanupBatchSize)
			}
			db, ob, err := a.openOutbox(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			start := time.Now()
			opts := core.CleanupOptions{Retention: retention, BatchSize: batchSize, Pause: pause, Logger: a.log}
			// The total to go, counted first (on the published_at index),
			// so that the progress says how far along it is; a partitioned
			// table drops partitions instead, and has no such count.
			total := int64(-1)
			if !partitioned && !quiet {
				n, err := ob.CountPublishedBefore(cmd.Context(), start.Add(-retention))
				if err != nil {
					return err
				}
				total = n
			}
			p := a.progress("deleted", total, quiet)
			opts.OnProgress = p.update
			var cleaner core.Cleaner = ob
			if partitioned {
				pm, err := dialect.NewPartitionMaintainer(db.db, db.dialect, dialect.PartitionOptions{Table: a.table, Ahead: ahead, Logger: a.log})
				if err != nil {
					return fmt.Errorf("%w: %w", ErrUsage, err)
				}
				cleaner = pm
			}
			n, err := core.Cleanup(cmd.Context(), cleaner, opts)
			p.done()
			if err != nil {
				return err
			}
			a.log.Info("txoutbox: cleanup done", "deleted", n, "retention", retention, "took", time.Since(start).Round(time.Millisecond))
			fmt.Fprintf(a.stdout, "deleted %d published event(s) older than %s\n", n, retention)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&retention, "retention", 30*24*time.Hour, "keep published events this long")
	fl.IntVar(&batchSize, "batch-size", 1000, "events per DELETE")
	fl.DurationVar(&pause, "pause", 0, "sleep between batches")
	fl.BoolVarP(&quiet, "quiet", "q", false, "no progress lines")
	fl.BoolVar(&partitioned, "partitioned", false, "the table is partitioned by day (migrate --partitioned): drop whole partitions")
	fl.IntVar(&ahead, "partitions-ahead", dialect.DefaultPartitionsAhead, "with --partitioned: daily partitions kept created ahead")
	return cmd
}

// isTerminal reports whether w (or the writer it wraps) is a character
// device (a terminal).
func isTerminal(w io.Writer) bool {
	for {
		u, ok := w.(interface{ Unwrap() io.Writer })
		if !ok {
			break
		}
		w = u.Unwrap()
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
