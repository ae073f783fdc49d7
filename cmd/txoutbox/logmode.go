package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/human"
	"github.com/txoutbox/txoutbox/logrelay"
)

// logNames are the flags naming log mode's slot and publication.
type logNames struct{ slot, publication string }

func (n *logNames) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&n.slot, "slot", logrelay.DefaultSlot, "the logical replication slot")
	cmd.Flags().StringVar(&n.publication, "publication", logrelay.DefaultPublication, "the publication the slot is streamed with")
}

func (n logNames) names(table string) logrelay.Names {
	return logrelay.Names{Table: table, Slot: n.slot, Publication: n.publication}
}

// postgresDSN returns --dsn, which log mode needs to be PostgreSQL's.
func (a *app) postgresDSN() (string, error) {
	dsn, err := a.requireDSN()
	if err != nil {
		return "", err
	}
	if _, _, d, err := parseDSN(dsn); err != nil {
		return "", err
	} else if d != dialect.Postgres {
		return "", usagef("log mode needs PostgreSQL (logical replication); --dsn is %s", d.Name())
	}
	return dsn, nil
}

func (a *app) logCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "log",
		Short: "Set up, inspect and remove log mode (PostgreSQL logical replication)",
		Long: `In log mode the relay reads the outbox's events from PostgreSQL's write-ahead
log through a logical replication slot, instead of claiming rows from the
table: producers' code does not change, the relay writes nothing per event, and
progress is the slot's confirmed position (docs/log-mode.md).

  txoutbox log create   the publication, the slot, then the trigger that sends
                        each insert into the outbox table to the log
                        (txoutbox migrate --mode log does the same after the
                        migrations)
  txoutbox log status   the slot: streaming or not, retained WAL, lag
  txoutbox log drop     back to table mode: drops the trigger, waits until
                        the relays confirmed what the slot holds, then drops
                        the slot and the publication

Then run 'txoutbox relay --mode log'. The server needs wal_level = logical,
the role REPLICATION (or superuser). An abandoned slot keeps WAL until the disk
fills: watch 'txoutbox log status' (or txoutbox_log_retained_wal_bytes) and set
max_slot_wal_keep_size.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(a.logCreateCommand(), a.logStatusCommand(), a.logDropCommand())
	return cmd
}

func (a *app) logCreateCommand() *cobra.Command {
	var n logNames
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create the publication, the slot and the trigger (idempotent)",
		Example: `  txoutbox log create --dsn "$DATABASE_URL"
  txoutbox relay --mode log --broker kafka://kafka:9092`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dsn, err := a.postgresDSN()
			if err != nil {
				return err
			}
			if err := logrelay.Setup(cmd.Context(), dsn, n.names(a.table)); err != nil {
				return logModeError(err)
			}
			fmt.Fprintf(a.stdout, "log mode set up on %s: table %s, slot %s, publication %s\n", redact(dsn), a.table, n.slot, n.publication)
			return nil
		},
	}
	n.register(cmd)
	return cmd
}

// logModeError marks logrelay's refusals of bad input as usage errors.
func logModeError(err error) error {
	if errors.Is(err, logrelay.ErrWALLevel) || errors.Is(err, core.ErrInvalidOptions) {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return err
}

// logStatusJSON is log status --format json: the slot as stats shows it,
// and what only log status shows.
type logStatusJSON struct {
	logStatsJSON
	ActivePID             int     `json:"active_pid,omitempty"`
	WALStatus             string  `json:"wal_status"`
	SafeWALBytes          int64   `json:"safe_wal_bytes"`
	TriggerInstalled      bool    `json:"trigger_installed"`
	PendingInTable        int64   `json:"pending_in_table"`
	OldestPendingAgeInTbl float64 `json:"oldest_pending_age_seconds_in_table"`
}

func (a *app) logStatusCommand() *cobra.Command {
	var (
		n      logNames
		format string
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the slot: streaming, retained WAL, confirmed lag, and the retry path's backlog",
		Long: `status reads the slot from the server:
  streaming      whether a relay streams it now (and its server process)
  retained WAL   what the slot keeps the server from removing: the disk an
                 abandoned slot fills
  unconfirmed    WAL written since the relays' confirmed position
  confirmed lag  how long ago the WAL now confirmed was written, as the
                 streaming walsender measures it ("-" when none streams)
  wal status     reserved or extended is healthy; unreserved is about to be
                 invalidated by max_slot_wal_keep_size; lost is invalidated
and the retry path: events pending in the outbox table.

It exits with status 3 when the slot is invalidated or missing while the
trigger still sends events to it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "table" && format != "json" {
				return usagef("--format %q: want table or json", format)
			}
			dsn, err := a.postgresDSN()
			if err != nil {
				return err
			}
			st, err := logrelay.Status(cmd.Context(), dsn, n.names(a.table))
			if err != nil {
				return logModeError(err)
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
			out := logStatusJSON{
				logStatsJSON: slotJSON(st), ActivePID: st.ActivePID,
				WALStatus: st.WALStatus, SafeWALBytes: st.SafeWALBytes,
				TriggerInstalled: st.TriggerInstalled, PendingInTable: s.Pending, OldestPendingAgeInTbl: s.OldestPendingAge.Seconds(),
			}
			if format == "json" {
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(out); err != nil {
					return err
				}
			} else {
				tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				lag := "-"
				if out.ConfirmedLagSeconds != nil {
					lag = st.ConfirmedAge.Round(time.Millisecond).String()
				}
				safe := "unlimited"
				if st.SafeWALBytes >= 0 {
					safe = human.Bytes(st.SafeWALBytes)
				}
				fmt.Fprintf(tw, "slot\t%s\t(exists: %t, trigger installed: %t)\n", st.Slot, st.Exists, st.TriggerInstalled)
				fmt.Fprintf(tw, "streaming\t%t\t%s\n", st.Active, map[bool]string{true: fmt.Sprintf("(server pid %d)", st.ActivePID), false: ""}[st.Active])
				fmt.Fprintf(tw, "retained WAL\t%s\t(safe before invalidation: %s)\n", human.Bytes(st.RetainedBytes), safe)
				fmt.Fprintf(tw, "unconfirmed WAL\t%s\t\n", human.Bytes(st.UnconfirmedBytes))
				fmt.Fprintf(tw, "confirmed lag\t%s\t\n", lag)
				fmt.Fprintf(tw, "wal status\t%s\t\n", orDefault(st.WALStatus, "-"))
				fmt.Fprintf(tw, "retry path\t%d pending\t(oldest %s)\n", s.Pending, age(s.Pending, s.OldestPendingAge))
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			switch {
			case st.Invalidated:
				return fmt.Errorf("%w: slot %s was invalidated by the server (wal_status lost): events may be missing; recreate it with 'txoutbox log create' and reconcile with the producers", ErrLagging, st.Slot)
			case !st.Exists && st.TriggerInstalled:
				return fmt.Errorf("%w: slot %s does not exist but the trigger is installed: run 'txoutbox log create'", ErrLagging, st.Slot)
			}
			return nil
		},
	}
	n.register(cmd)
	cmd.Flags().StringVar(&format, "format", "table", "output format: table or json")
	return cmd
}

func (a *app) logDropCommand() *cobra.Command {
	var (
		n     logNames
		wait  time.Duration
		force bool
	)
	cmd := &cobra.Command{
		Use:   "drop",
		Short: "Go back to table mode: drop the trigger, wait for the slot to drain, drop the slot and the publication",
		Long: `drop switches the outbox back to table mode. It drops the trigger first, so
that from that moment producers' events land in the table (where a table-mode
relay publishes them); then it waits up to --wait for the log relays to confirm
everything the slot holds from before that moment; then it drops the slot and
the publication, disconnecting the log relays (they stop with "replication
slot does not exist").

If the slot does not drain in time (no log relay runs?), drop stops with exit
status 1 and leaves the slot: run a log relay, then drop again. --force drops
it anyway, losing the events in it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dsn, err := a.postgresDSN()
			if err != nil {
				return err
			}
			if err := logrelay.Teardown(cmd.Context(), dsn, n.names(a.table), logrelay.TeardownOptions{Wait: wait, Force: force}); err != nil {
				return logModeError(err)
			}
			fmt.Fprintf(a.stdout, "log mode removed from %s: table %s is in table mode\n", redact(dsn), a.table)
			return nil
		},
	}
	n.register(cmd)
	cmd.Flags().DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the relays to confirm what the slot holds")
	cmd.Flags().BoolVar(&force, "force", false, "drop the slot even if it holds unconfirmed events (they are lost)")
	return cmd
}
