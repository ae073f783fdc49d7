package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/txoutbox/txoutbox/archive"
	"github.com/txoutbox/txoutbox/dialect"
)

func (a *app) replayCommand() *cobra.Command {
	var (
		fromSeq, toSeq                        int64
		since, until                          string
		aggregateType, aggregateID, eventType string
		all, yes                              bool
		from, prefix, broker                  string
		batchSize                             int
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Publish already published events again (by seq range, time range, aggregate or type)",
		Long: `replay makes published events pending again, so that the running relay
publishes them once more, under their original event IDs. Consumers with an
inbox skip the events they already processed; a new consumer, or one whose
inbox was reset, receives the history. Only events still in the table (younger
than the cleanup retention) can be replayed.

With --from, replay reads the archive that 'txoutbox archive' wrote to that
bucket instead, and publishes the selected events itself through --broker, in
seq order, with their original event IDs and a progress line with the total; it
needs no database. An event the broker keeps refusing stops it with an error
naming its seq: run it again with --from-seq to go on.

Selectors combine with AND. --since and --until bound the events' creation time
(RFC 3339, a date, or a duration ago such as 24h); --from-seq and --to-seq are
inclusive. Give at least one selector, or --all; replaying everything asks for
confirmation unless --yes.`,
		Example: `  # Everything one order went through:
  txoutbox replay --aggregate-type order --aggregate-id 42

  # Yesterday's order.created events:
  txoutbox replay --type order.created --since 2026-12-01 --until 2026-12-02

  # A range of Seqs, and the last hour:
  txoutbox replay --from-seq 1000 --to-seq 1999
  txoutbox replay --since 1h

  # From the archive, straight to the broker:
  txoutbox replay --from 'file:///var/lib/txoutbox/archive' --broker amqp://localhost:5672/ --type order.created`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			now := time.Now()
			f := dialect.ReplayFilter{FromSeq: fromSeq, ToSeq: toSeq, AggregateType: aggregateType,
				AggregateID: aggregateID, EventType: eventType, All: all}
			var err error
			if since != "" {
				if f.CreatedFrom, err = parseTime(since, now); err != nil {
					return usagef("--since: %v", err)
				}
			}
			if until != "" {
				if f.CreatedTo, err = parseTime(until, now); err != nil {
					return usagef("--until: %v", err)
				}
			}
			selected := f.FromSeq != 0 || f.ToSeq != 0 || !f.CreatedFrom.IsZero() || !f.CreatedTo.IsZero() ||
				f.AggregateType != "" || f.AggregateID != "" || f.EventType != ""
			switch {
			case !selected && !all:
				return usagef("replay needs --from-seq, --to-seq, --since, --until, --aggregate-type, --aggregate-id, --type or --all")
			case selected && all:
				return usagef("replay: --all cannot be combined with other selectors")
			case fromSeq < 0 || toSeq < 0 || (toSeq != 0 && fromSeq > toSeq):
				return usagef("replay: bad seq range %d..%d", fromSeq, toSeq)
			}
			if from != "" {
				return a.replayArchive(cmd.Context(), from, prefix, broker, batchSize, f, yes)
			}
			db, ob, err := a.openOutbox(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			if all && !yes && !a.confirm("Publish every published event still in the outbox again? [y/N] ") {
				return ErrAborted
			}
			n, err := ob.Replay(cmd.Context(), f)
			if err != nil {
				return fmt.Errorf("replay: %w", err)
			}
			a.log.Info("txoutbox: events re-queued for replay", "count", n, "from_seq", fromSeq, "to_seq", toSeq,
				"since", since, "until", until, "aggregate_type", aggregateType, "aggregate_id", aggregateID, "event_type", eventType)
			fmt.Fprintf(a.stdout, "re-queued %d published event(s) for replay\n", n)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.Int64Var(&fromSeq, "from-seq", 0, "first Seq (inclusive)")
	fl.Int64Var(&toSeq, "to-seq", 0, "last Seq (inclusive)")
	fl.StringVar(&since, "since", "", "created at or after: RFC 3339, a date, or a duration ago (24h)")
	fl.StringVar(&until, "until", "", "created before: RFC 3339, a date, or a duration ago")
	fl.StringVar(&aggregateType, "aggregate-type", "", "aggregate type")
	fl.StringVar(&aggregateID, "aggregate-id", "", "aggregate ID")
	fl.StringVar(&eventType, "type", "", "event type")
	fl.BoolVar(&all, "all", false, "every published event still in the table")
	fl.BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation (--all)")
	fl.StringVar(&from, "from", "", "replay from the archive in this bucket (file://, s3://) instead of the table")
	fl.StringVar(&prefix, "prefix", "", "with --from: the archive's object name prefix")
	fl.StringVar(&broker, "broker", "", "with --from: broker URL to publish to (as relay --broker)")
	fl.IntVar(&batchSize, "batch-size", 100, "with --from: events per publish")
	return cmd
}

// replayArchive publishes the archived events f selects through the broker.
func (a *app) replayArchive(ctx context.Context, from, prefix, broker string, batchSize int, f dialect.ReplayFilter, yes bool) error {
	if batchSize < 1 || batchSize > 10_000 {
		return usagef("--batch-size: want 1 to 10000")
	}
	if err := checkBrokerURL(broker); err != nil {
		return err
	}
	b, err := openBucket(ctx, "--from", from)
	if err != nil {
		return err
	}
	defer b.Close()
	r := archive.NewReader(b, prefix)
	if f.All && !yes && !a.confirm("Publish every archived event again? [y/N] ") {
		return ErrAborted
	}
	pub, err := openBroker(ctx, broker, a.stdout, a.log, "")
	if err != nil {
		return err
	}
	defer pub.Close()
	p := a.progress("replayed", -1, false)
	n, err := archive.Replay(ctx, r, pub, f, archive.ReplayOptions{BatchSize: batchSize, Logger: a.log,
		OnProgress: func(done, total int64) { p.total = total; p.update(done) }})
	p.done()
	if err != nil {
		return fmt.Errorf("replay from %s after %d published: %w", redact(from), n, err)
	}
	a.log.Info("txoutbox: archived events replayed", "count", n, "from", redact(from))
	// On stderr with the progress: stdout is the log:// sink's.
	fmt.Fprintf(a.stderr, "published %d archived event(s) again\n", n)
	return nil
}
