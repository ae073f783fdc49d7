package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// buckets
	_ "gocloud.dev/blob/s3blob"   // s3:// buckets

	"github.com/txoutbox/txoutbox/archive"
	"github.com/txoutbox/txoutbox/dialect"
)

// bucketHelp documents bucket URLs where a command takes one.
const bucketHelp = `Bucket URLs (gocloud.dev/blob):
  file:///var/lib/txoutbox/archive?create_dir=true   a local directory
  s3://my-bucket?region=eu-west-1                     AWS S3; credentials from the
      usual AWS sources (environment, profile, instance role)
  s3://my-bucket?endpoint=http://127.0.0.1:9000&use_path_style=true&region=us-east-1
                                                      an S3-compatible server`

// openBucket opens the bucket of rawURL; its errors never print a secret.
func openBucket(ctx context.Context, flag, rawURL string) (*blob.Bucket, error) {
	if rawURL == "" {
		return nil, usagef("%s needs a bucket URL such as file:///var/lib/txoutbox/archive?create_dir=true", flag)
	}
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok || (scheme != "file" && scheme != "s3") {
		return nil, usagef("%s %s: want a file:// or s3:// URL", flag, redact(rawURL))
	}
	b, err := blob.OpenBucket(ctx, rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s: %s", ErrUsage, flag, redact(rawURL), redact(err.Error()))
	}
	return b, nil
}

func (a *app) archiveCommand() *cobra.Command {
	var (
		to, prefix  string
		retention   time.Duration
		batchSize   int
		quiet       bool
		partitioned bool
	)
	cmd := &cobra.Command{
		Use:   "archive",
		Short: "Move published events older than the retention to a bucket, then delete them",
		Long: `archive writes the events published more than --retention ago to the bucket
of --to, as gzip-compressed JSON Lines, one object per day of creation and batch
of --batch-size, each with a manifest (count, seq and time ranges, checksums).
A batch's rows are deleted only once its objects were written, read back and
verified; a run killed at any point loses nothing, and the next run finishes
the work without a second copy. Pending and dead events are never archived.

One archiver works at a time: another one finds the lock held and exits with
an error saying so. The relay can archive on its schedule instead of deleting
(relay --cleanup-interval --archive-to). 'txoutbox replay --from' publishes
archived events again. For a table made by 'migrate --partitioned', pass
--partitioned: the partitions archiving emptied are then dropped whole.

` + bucketHelp,
		Example: `  txoutbox archive --to 'file:///var/lib/txoutbox/archive?create_dir=true'
  txoutbox archive --to 's3://outbox-archive?region=eu-west-1' --prefix orders --retention 168h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if retention <= 0 || batchSize < 1 || batchSize > archive.MaxBatchSize {
				return usagef("--retention must be positive, --batch-size from 1 to %d", archive.MaxBatchSize)
			}
			ctx := cmd.Context()
			b, err := openBucket(ctx, "--to", to)
			if err != nil {
				return err
			}
			defer b.Close()
			db, ob, err := a.openOutbox(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			ar, err := archive.New(ob, b, archive.Options{Retention: retention, BatchSize: batchSize, Prefix: prefix,
				LockName: "txoutbox_archive:" + a.table, Logger: a.log})
			if err != nil {
				return fmt.Errorf("%w: %w", ErrUsage, err)
			}
			start := time.Now()
			before := start.Add(-retention)
			total := int64(-1)
			if !quiet {
				if total, err = ob.CountPublishedBefore(ctx, before); err != nil {
					return err
				}
			}
			p := a.progress("archived", total, quiet)
			res, err := ar.ArchiveBefore(ctx, before, func(r archive.Result) { p.update(r.Deleted) })
			p.done()
			if err != nil {
				return err
			}
			if partitioned {
				// The partitions archiving emptied go whole.
				pm, err := dialect.NewPartitionMaintainer(db.db, db.dialect, dialect.PartitionOptions{Table: a.table, Logger: a.log})
				if err != nil {
					return fmt.Errorf("%w: %w", ErrUsage, err)
				}
				if _, err := pm.DeletePublished(ctx, before, 1); err != nil {
					return err
				}
			}
			a.log.Info("txoutbox: archive done", "events", res.Events, "objects", res.Objects, "reused", res.Reused,
				"deleted", res.Deleted, "retention", retention, "took", time.Since(start).Round(time.Millisecond))
			fmt.Fprintf(a.stdout, "archived %d event(s) older than %s in %d object(s); deleted %d row(s)\n",
				res.Events, retention, res.Objects+res.Reused, res.Deleted)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&to, "to", "", "bucket URL (file://, s3://)")
	fl.StringVar(&prefix, "prefix", "", "object name prefix, e.g. orders/")
	fl.DurationVar(&retention, "retention", 30*24*time.Hour, "archive events published longer ago than this")
	fl.IntVar(&batchSize, "batch-size", 10_000, "events per batch (object, DELETE)")
	fl.BoolVarP(&quiet, "quiet", "q", false, "no progress lines")
	fl.BoolVar(&partitioned, "partitioned", false, "the table is partitioned by day (migrate --partitioned): drop the partitions archiving emptied")
	return cmd
}

// progress prints a running count on stderr: rewritten in place on a
// terminal, a line per update elsewhere.
type progress struct {
	a       *app
	verb    string
	total   int64
	quiet   bool
	start   time.Time
	printed bool
}

func (a *app) progress(verb string, total int64, quiet bool) *progress {
	return &progress{a: a, verb: verb, total: total, quiet: quiet, start: time.Now()}
}

func (p *progress) update(n int64) {
	if p.quiet {
		return
	}
	p.printed = true
	rate := float64(n) / max(time.Since(p.start).Seconds(), 1e-3)
	of := ""
	if p.total > 0 {
		of = fmt.Sprintf(" of %d (%d%%)", p.total, min(100, n*100/p.total))
	}
	if isTerminal(p.a.stderr) {
		fmt.Fprintf(p.a.stderr, "\r%s %d%s events (%.0f/s)", p.verb, n, of, rate)
	} else {
		fmt.Fprintf(p.a.stderr, "%s %d%s events (%.0f/s)\n", p.verb, n, of, rate)
	}
}

func (p *progress) done() {
	if p.printed && isTerminal(p.a.stderr) {
		fmt.Fprintln(p.a.stderr)
	}
}
