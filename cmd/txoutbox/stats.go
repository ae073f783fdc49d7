package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/txoutbox/txoutbox/core"
)

// statsJSON is the output of stats --format json. Durations are seconds, so
// that jq and alerting scripts compare numbers.
type statsJSON struct {
	Pending                 int64                    `json:"pending"`
	OldestPending           *time.Time               `json:"oldest_pending,omitempty"`
	OldestPendingAgeSeconds float64                  `json:"oldest_pending_age_seconds"`
	Dead                    int64                    `json:"dead"`
	ByType                  map[string]typeStatsJSON `json:"by_type"`
}

type typeStatsJSON struct {
	Pending                 int64   `json:"pending"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	Dead                    int64   `json:"dead"`
}

func (a *app) statsCommand() *cobra.Command {
	var (
		format string
		maxAge time.Duration
	)
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show pending, oldest pending age and dead-lettered counts, per event type",
		Long: `stats reads the outbox's health: how many events wait to be published, how
long the oldest of them has waited (by the database's clock), and how many are
dead-lettered, in total and per event type.

A growing oldest pending age means the relay is down, stuck or too slow; dead
events need an operator (see 'txoutbox dead --help').

With --max-age, stats exits with status 3 when the oldest pending event is
older than the limit, for cron jobs and health checks.`,
		Example: `  txoutbox stats
  txoutbox stats --format json | jq '.by_type["order.created"].pending'

  # Fail a health check when anything has waited more than 5 minutes:
  txoutbox stats --max-age 5m > /dev/null || page-someone`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "table" && format != "json" {
				return usagef("--format %q: want table or json", format)
			}
			db, ob, err := a.openOutbox(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			s, err := ob.Stats(cmd.Context())
			if err != nil {
				return fmt.Errorf("read stats: %w", err)
			}
			if format == "json" {
				err = writeStatsJSON(a.stdout, s)
			} else {
				err = writeStatsTable(a.stdout, s)
			}
			if err != nil {
				return err
			}
			if maxAge > 0 && s.Pending > 0 && s.OldestPendingAge > maxAge {
				a.log.Warn("txoutbox: outbox is lagging", "oldest_pending_age", s.OldestPendingAge, "max_age", maxAge, "pending", s.Pending)
				return fmt.Errorf("%w: oldest pending event waited %s (--max-age %s)", ErrLagging, s.OldestPendingAge.Round(time.Second), maxAge)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&format, "format", "table", "output format: table or json")
	cmd.Flags().DurationVar(&maxAge, "max-age", 0, "exit with status 3 when the oldest pending event is older (0: never)")
	return cmd
}

func writeStatsJSON(w io.Writer, s core.Stats) error {
	out := statsJSON{
		Pending: s.Pending, OldestPendingAgeSeconds: s.OldestPendingAge.Seconds(), Dead: s.Dead,
		ByType: make(map[string]typeStatsJSON, len(s.ByType)),
	}
	if !s.OldestPending.IsZero() {
		t := s.OldestPending.UTC()
		out.OldestPending = &t
	}
	for name, ts := range s.ByType {
		out.ByType[name] = typeStatsJSON{Pending: ts.Pending, OldestPendingAgeSeconds: ts.OldestPendingAge.Seconds(), Dead: ts.Dead}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func writeStatsTable(w io.Writer, s core.Stats) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT TYPE\tPENDING\tOLDEST PENDING\tDEAD")
	names := make([]string, 0, len(s.ByType))
	for name := range s.ByType {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		ts := s.ByType[name]
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\n", name, ts.Pending, age(ts.Pending, ts.OldestPendingAge), ts.Dead)
	}
	fmt.Fprintf(tw, "TOTAL\t%d\t%s\t%d\n", s.Pending, age(s.Pending, s.OldestPendingAge), s.Dead)
	return tw.Flush()
}

// age formats an oldest-pending age for people: "-" when nothing is pending.
func age(pending int64, d time.Duration) string {
	if pending == 0 {
		return "-"
	}
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}
