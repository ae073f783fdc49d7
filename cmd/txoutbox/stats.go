package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/human"
	"github.com/txoutbox/txoutbox/logrelay"
)

// statsJSON is the output of stats --format json. Durations are seconds, so
// that jq and alerting scripts compare numbers.
type statsJSON struct {
	Pending                 int64      `json:"pending"`
	OldestPending           *time.Time `json:"oldest_pending,omitempty"`
	OldestPendingAgeSeconds float64    `json:"oldest_pending_age_seconds"`
	Dead                    int64      `json:"dead"`
	// Scheduled counts events whose NotBefore is ahead: not lag.
	Scheduled int64                    `json:"scheduled"`
	ByType    map[string]typeStatsJSON `json:"by_type"`
	// LogMode is set when the table is in log mode: its pending events
	// are also in the slot, unconfirmed.
	LogMode *logStatsJSON `json:"log_mode,omitempty"`
}

// logStatsJSON is the slot's part of stats in log mode.
type logStatsJSON struct {
	Slot                string   `json:"slot"`
	Exists              bool     `json:"exists"`
	Streaming           bool     `json:"streaming"`
	UnconfirmedWALBytes int64    `json:"unconfirmed_wal_bytes"`
	RetainedWALBytes    int64    `json:"retained_wal_bytes"`
	ConfirmedLagSeconds *float64 `json:"confirmed_lag_seconds"`
	Invalidated         bool     `json:"invalidated"`
}

type typeStatsJSON struct {
	Pending                 int64   `json:"pending"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	Dead                    int64   `json:"dead"`
	Scheduled               int64   `json:"scheduled"`
}

func (a *app) statsCommand() *cobra.Command {
	var (
		format string
		maxAge time.Duration
		slot   string
		config string
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
older than the limit, for cron jobs and health checks.

In log mode (PostgreSQL; 'txoutbox log --help') the table holds only the
events whose publish failed: the others are pending in the slot until the
relay confirms them. stats then also shows the slot (--slot): whether a relay
streams it, the WAL not yet confirmed, and the confirmed position's lag, which
--max-age also checks.

With --config FILE (the file of 'txoutbox relay --config'), stats reads every
outbox the file lists, each under its name; the DSNs and tables come from the
file, the brokers and relay options in it are not read. An outbox whose
database does not answer is reported as such and the others are still read;
stats then exits with status 1. The JSON form is {"outboxes": [{"name": ...,
"error": ..., and the fields above}]}.`,
		Example: `  txoutbox stats
  txoutbox stats --format json | jq '.by_type["order.created"].pending'
  txoutbox stats --config outboxes.yaml --max-age 5m

  # Fail a health check when anything has waited more than 5 minutes:
  txoutbox stats --max-age 5m > /dev/null || page-someone`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "table" && format != "json" {
				return usagef("--format %q: want table or json", format)
			}
			if config != "" {
				return a.groupStats(cmd.Context(), config, format, maxAge)
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
			lm, err := a.logModeStats(cmd.Context(), db, ob, slot)
			if err != nil {
				return err
			}
			if format == "json" {
				err = writeStatsJSON(a.stdout, s, lm)
			} else {
				err = writeStatsTable(a.stdout, s, lm)
			}
			if err != nil {
				return err
			}
			if lm != nil && maxAge > 0 && (lm.Invalidated || (lm.ConfirmedLagSeconds != nil && *lm.ConfirmedLagSeconds > maxAge.Seconds()) ||
				(!lm.Streaming && lm.UnconfirmedWALBytes > 0)) {
				a.log.Warn("txoutbox: log mode's slot is lagging", "slot", lm.Slot, "streaming", lm.Streaming, "unconfirmed_wal_bytes", lm.UnconfirmedWALBytes, "max_age", maxAge)
				return fmt.Errorf("%w: slot %s: streaming %t, %d bytes of WAL unconfirmed, invalidated %t (--max-age %s)", ErrLagging, lm.Slot, lm.Streaming, lm.UnconfirmedWALBytes, lm.Invalidated, maxAge)
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
	cmd.Flags().StringVar(&slot, "slot", logrelay.DefaultSlot, "log mode: the replication slot to report on")
	cmd.Flags().StringVar(&config, "config", "", "read every outbox of this relay --config file instead of --dsn's")
	return cmd
}

// outboxStatsJSON is one outbox of stats --config --format json: its
// stats, or the error that kept them from being read.
type outboxStatsJSON struct {
	Name  string `json:"name"`
	Error string `json:"error,omitempty"`
	*statsJSON
}

// groupStats is stats --config: every outbox of the file, one after the
// other, each read even when another's database is down.
func (a *app) groupStats(ctx context.Context, path, format string, maxAge time.Duration) error {
	specs, err := readGroupFile(path, (*outboxSpec).resolveTable)
	if err != nil {
		return err
	}
	var failed, lagging []string
	out := make([]outboxStatsJSON, len(specs))
	stats := make([]core.Stats, len(specs))
	for i, spec := range specs {
		out[i].Name = spec.Name
		st, err := a.outboxStats(ctx, spec)
		if err != nil {
			failed = append(failed, spec.Name)
			out[i].Error = err.Error()
			a.log.Error("txoutbox: stats: cannot read an outbox", "outbox", spec.Name, "error", err)
			continue
		}
		stats[i] = st
		j := statsToJSON(st, nil)
		out[i].statsJSON = &j
		if maxAge > 0 && st.Pending > 0 && st.OldestPendingAge > maxAge {
			lagging = append(lagging, spec.Name)
			a.log.Warn("txoutbox: outbox is lagging", "outbox", spec.Name, "oldest_pending_age", st.OldestPendingAge, "max_age", maxAge, "pending", st.Pending)
		}
	}
	if format == "json" {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(struct {
			Outboxes []outboxStatsJSON `json:"outboxes"`
		}{out})
	} else {
		for i, o := range out {
			if i > 0 {
				fmt.Fprintln(a.stdout)
			}
			fmt.Fprintf(a.stdout, "OUTBOX %s (table %s)\n", o.Name, specs[i].Table)
			if o.Error != "" {
				fmt.Fprintf(a.stdout, "error: %s\n", o.Error)
				continue
			}
			if err = writeStatsTable(a.stdout, stats[i], nil); err != nil {
				break
			}
		}
	}
	switch {
	case err != nil:
		return err
	case len(failed) > 0:
		return fmt.Errorf("read stats: %d of %d outboxes could not be read: %s", len(failed), len(specs), strings.Join(failed, ", "))
	case len(lagging) > 0:
		return fmt.Errorf("%w: %s (--max-age %s)", ErrLagging, strings.Join(lagging, ", "), maxAge)
	}
	return nil
}

// outboxStats reads one outbox of a --config file, its connection
// opened for it and closed after.
func (a *app) outboxStats(ctx context.Context, spec outboxSpec) (core.Stats, error) {
	db, err := openDatabase(ctx, spec.dsn)
	if err != nil {
		return core.Stats{}, err
	}
	defer db.Close()
	ob, err := sqlxoutbox.NewDB(db.db, sqlxoutbox.Options{Dialect: db.dialect, Table: spec.Table, Logger: a.log})
	if err != nil {
		return core.Stats{}, err
	}
	if err := ob.Ping(ctx); err != nil {
		return core.Stats{}, err
	}
	return ob.Stats(ctx)
}

// logModeStats returns the slot's state when the table is in log mode
// (PostgreSQL, log mode's trigger on it), else nil.
func (a *app) logModeStats(ctx context.Context, db *database, ob *sqlxoutbox.Outbox, slot string) (*logStatsJSON, error) {
	if db.dialect != dialect.Postgres {
		return nil, nil
	}
	var on bool
	if err := db.db.QueryRowContext(ctx, ob.Queries().LogMode()).Scan(&on); err != nil {
		return nil, fmt.Errorf("read stats: %w", err)
	}
	if !on {
		return nil, nil
	}
	// Through the pool stats already holds, not a connection of its own.
	st, err := logrelay.StatusDB(ctx, db.db, logrelay.Names{Table: a.table, Slot: slot})
	if err != nil {
		return nil, logModeError(err)
	}
	out := slotJSON(st)
	return &out, nil
}

// slotJSON is the slot's state as stats and log status print it: the
// confirmed lag is null when no relay streams.
func slotJSON(st logrelay.SlotStatus) logStatsJSON {
	out := logStatsJSON{Slot: st.Slot, Exists: st.Exists, Streaming: st.Active, UnconfirmedWALBytes: st.UnconfirmedBytes,
		RetainedWALBytes: st.RetainedBytes, Invalidated: st.Invalidated}
	if st.Exists && st.ConfirmedAge >= 0 {
		v := st.ConfirmedAge.Seconds()
		out.ConfirmedLagSeconds = &v
	}
	return out
}

func writeStatsJSON(w io.Writer, s core.Stats, lm *logStatsJSON) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(statsToJSON(s, lm))
}

func statsToJSON(s core.Stats, lm *logStatsJSON) statsJSON {
	out := statsJSON{
		Pending: s.Pending, OldestPendingAgeSeconds: s.OldestPendingAge.Seconds(), Dead: s.Dead, Scheduled: s.Scheduled,
		ByType: make(map[string]typeStatsJSON, len(s.ByType)), LogMode: lm,
	}
	if !s.OldestPending.IsZero() {
		t := s.OldestPending.UTC()
		out.OldestPending = &t
	}
	for name, ts := range s.ByType {
		out.ByType[name] = typeStatsJSON{Pending: ts.Pending, OldestPendingAgeSeconds: ts.OldestPendingAge.Seconds(), Dead: ts.Dead, Scheduled: ts.Scheduled}
	}
	return out
}

func writeStatsTable(w io.Writer, s core.Stats, lm *logStatsJSON) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT TYPE\tPENDING\tOLDEST PENDING\tDEAD\tSCHEDULED")
	names := make([]string, 0, len(s.ByType))
	for name := range s.ByType {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		ts := s.ByType[name]
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\n", name, ts.Pending, age(ts.Pending, ts.OldestPendingAge), ts.Dead, ts.Scheduled)
	}
	fmt.Fprintf(tw, "TOTAL\t%d\t%s\t%d\t%d\n", s.Pending, age(s.Pending, s.OldestPendingAge), s.Dead, s.Scheduled)
	if err := tw.Flush(); err != nil {
		return err
	}
	if lm != nil {
		lag := "-"
		if lm.ConfirmedLagSeconds != nil {
			lag = time.Duration(*lm.ConfirmedLagSeconds * float64(time.Second)).Round(time.Millisecond).String()
		}
		_, err := fmt.Fprintf(w, "\nlog mode: the table holds the failed events; the others are pending in slot %s until confirmed:\n"+
			"  exists %t, streaming %t, unconfirmed WAL %s, retained WAL %s, confirmed lag %s, invalidated %t ('txoutbox log status')\n",
			lm.Slot, lm.Exists, lm.Streaming, human.Bytes(lm.UnconfirmedWALBytes), human.Bytes(lm.RetainedWALBytes), lag, lm.Invalidated)
		return err
	}
	return nil
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
