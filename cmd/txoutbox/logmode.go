package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/txoutbox/txoutbox/binlogrelay"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/human"
	"github.com/txoutbox/txoutbox/internal/mysqldsn"
	"github.com/txoutbox/txoutbox/logrelay"
)

// logNames are the flags naming log mode's objects: the slot and the
// publication on PostgreSQL, the stream on MySQL and MariaDB.
type logNames struct{ slot, publication, stream string }

func (n *logNames) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&n.slot, "slot", logrelay.DefaultSlot, "PostgreSQL: the logical replication slot")
	cmd.Flags().StringVar(&n.publication, "publication", logrelay.DefaultPublication, "PostgreSQL: the publication the slot is streamed with")
	cmd.Flags().StringVar(&n.stream, "stream", binlogrelay.DefaultName, "MySQL/MariaDB: the stream's name (its stored binlog position and its lock)")
}

func (n logNames) names(table string) logrelay.Names {
	return logrelay.Names{Table: table, Slot: n.slot, Publication: n.publication}
}

func (n logNames) binlog(table string) binlogrelay.Names {
	return binlogrelay.Names{Table: table, Name: n.stream}
}

// logDSN returns --dsn, which log mode needs to be PostgreSQL's or
// MySQL's, and its dialect; a MySQL DSN comes in the driver's form.
func (a *app) logDSN() (string, dialect.Dialect, error) {
	dsn, err := a.requireDSN()
	if err != nil {
		return "", dialect.Dialect{}, err
	}
	_, _, d, err := parseDSN(dsn)
	switch {
	case err != nil:
		return "", d, err
	case d == dialect.MySQL:
		driverDSN, err := mysqldsn.DriverDSN(dsn)
		if err != nil {
			return "", d, usagef("--dsn: %v", err)
		}
		return driverDSN, d, nil
	case d != dialect.Postgres:
		return "", d, usagef("log mode needs PostgreSQL (logical replication) or MySQL/MariaDB (the binlog); --dsn is %s", d.Name())
	}
	return dsn, d, nil
}

func (a *app) logCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "log",
		Short: "Set up, inspect and remove log mode (PostgreSQL logical replication, the MySQL/MariaDB binlog)",
		Long: `In log mode the relay reads the outbox's events from the database's log
instead of claiming rows from the table: producers' code does not change, the
relay writes nothing per event, and progress is the log position it confirmed:
PostgreSQL's logical replication slot (docs/log-mode.md), or the binlog
position stored in txoutbox_log_positions on MySQL and MariaDB (docs/mysql.md).

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
max_slot_wal_keep_size.

On MySQL and MariaDB, create stores the server's binlog position and gives
published_at the default that hands producers' rows to the log; status shows
the position, how far the server's binlog is ahead, and whether the server
still has the file; drop removes the default and waits for the stream to pass
the switch; recover (after the server purged a binlog the stream needed) hands
the events since the stored position to the table's retry path. The server
needs log_bin, binlog_format=ROW, binlog_row_image=FULL; the user REPLICATION
SLAVE and BINLOG MONITOR (MariaDB) or REPLICATION CLIENT (MySQL).`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(a.logCreateCommand(), a.logStatusCommand(), a.logDropCommand(), a.logRecoverCommand())
	return cmd
}

func (a *app) logCreateCommand() *cobra.Command {
	var n logNames
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Set log mode up: PostgreSQL's publication, slot and trigger; MySQL's stored position and published_at's default (idempotent)",
		Example: `  txoutbox log create --dsn "$DATABASE_URL"
  txoutbox relay --mode log --broker kafka://kafka:9092`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.setupLogMode(cmd.Context(), n, "log mode set up on %s: table %s, ")
		},
	}
	n.register(cmd)
	return cmd
}

// setupLogMode sets log mode up on --dsn and says so with done's format
// (the DSN and the table) followed by the objects' names.
func (a *app) setupLogMode(ctx context.Context, n logNames, done string) error {
	dsn, d, err := a.logDSN()
	if err != nil {
		return err
	}
	if d == dialect.MySQL {
		if err := binlogrelay.Setup(ctx, dsn, n.binlog(a.table)); err != nil {
			return logModeError(err)
		}
		fmt.Fprintf(a.stdout, done+"stream %s\n", redact(dsn), a.table, n.stream)
		return nil
	}
	if err := logrelay.Setup(ctx, dsn, n.names(a.table)); err != nil {
		return logModeError(err)
	}
	fmt.Fprintf(a.stdout, done+"slot %s, publication %s\n", redact(dsn), a.table, n.slot, n.publication)
	return nil
}

// logModeError marks log mode's refusals of bad input as usage errors.
func logModeError(err error) error {
	if errors.Is(err, logrelay.ErrWALLevel) || errors.Is(err, binlogrelay.ErrBinlogOff) || errors.Is(err, core.ErrInvalidOptions) {
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
			dsn, d, err := a.logDSN()
			if err != nil {
				return err
			}
			if d == dialect.MySQL {
				return a.binlogStatus(cmd.Context(), n, format)
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
it anyway, losing the events in it.

On MySQL and MariaDB, drop removes published_at's default first, then waits
for the stream's stored position to pass that moment, then deletes the
position. --force hands what the stream did not reach to the table's retry
path instead of failing (the events come again, at least once; none is lost).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dsn, d, err := a.logDSN()
			if err != nil {
				return err
			}
			if d == dialect.MySQL {
				err = binlogrelay.Teardown(cmd.Context(), dsn, n.binlog(a.table), binlogrelay.TeardownOptions{Wait: wait, Force: force})
			} else {
				err = logrelay.Teardown(cmd.Context(), dsn, n.names(a.table), logrelay.TeardownOptions{Wait: wait, Force: force})
			}
			if err != nil {
				return logModeError(err)
			}
			fmt.Fprintf(a.stdout, "log mode removed from %s: table %s is in table mode\n", redact(dsn), a.table)
			return nil
		},
	}
	n.register(cmd)
	cmd.Flags().DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the relays to confirm what the slot holds")
	cmd.Flags().BoolVar(&force, "force", false, "PostgreSQL: drop the slot even if it holds unconfirmed events (they are lost); MySQL: hand them to the table's retry path")
	return cmd
}

// binlogStatusJSON is log status --format json on MySQL and MariaDB.
type binlogStatusJSON struct {
	Stream                  string  `json:"stream"`
	Exists                  bool    `json:"exists"`
	DefaultSet              bool    `json:"default_set"`
	Streaming               bool    `json:"streaming"`
	StreamingConnection     int64   `json:"streaming_connection,omitempty"`
	Position                string  `json:"position"`
	ServerPosition          string  `json:"server_position"`
	BehindBytes             int64   `json:"behind_bytes"`
	LagSeconds              float64 `json:"lag_seconds"`
	FilesHeld               bool    `json:"files_held"`
	StoredAt                string  `json:"stored_at,omitempty"`
	PendingInTable          int64   `json:"pending_in_table"`
	OldestPendingAgeInTable float64 `json:"oldest_pending_age_seconds_in_table"`
}

// binlogStatus is log status on MySQL and MariaDB.
func (a *app) binlogStatus(ctx context.Context, n logNames, format string) error {
	db, ob, err := a.openOutbox(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	st, err := binlogrelay.ReadStatus(ctx, db.db, n.binlog(a.table))
	if err != nil {
		return logModeError(err)
	}
	s, err := ob.Stats(ctx)
	if err != nil {
		return fmt.Errorf("read stats: %w", err)
	}
	out := binlogStatusJSON{
		Stream: st.Name, Exists: st.Exists, DefaultSet: st.DefaultSet, Streaming: st.Streaming, StreamingConnection: st.StreamingConnection,
		Position: st.Position.String(), ServerPosition: st.Server.String(), BehindBytes: st.BehindBytes, LagSeconds: st.Lag.Seconds(),
		FilesHeld: st.FilesHeld, PendingInTable: s.Pending, OldestPendingAgeInTable: s.OldestPendingAge.Seconds(),
	}
	if st.Exists {
		out.StoredAt = st.StoredAt.Format(time.RFC3339Nano)
	}
	if format == "json" {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "stream\t%s\t(exists: %t, published_at default set: %t)\n", st.Name, st.Exists, st.DefaultSet)
		fmt.Fprintf(tw, "streaming\t%t\t%s\n", st.Streaming, map[bool]string{true: fmt.Sprintf("(server connection %d)", st.StreamingConnection), false: ""}[st.Streaming])
		fmt.Fprintf(tw, "position\t%s\t(server at %s; stored %s ago)\n", st.Position, st.Server, time.Since(st.StoredAt).Round(time.Millisecond))
		fmt.Fprintf(tw, "behind\t%s\t(lag %s)\n", human.Bytes(st.BehindBytes), st.Lag.Round(time.Millisecond))
		fmt.Fprintf(tw, "binlog held\t%t\t\n", st.FilesHeld)
		fmt.Fprintf(tw, "retry path\t%d pending\t(oldest %s)\n", s.Pending, age(s.Pending, s.OldestPendingAge))
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	switch {
	case st.Exists && !st.FilesHeld:
		return fmt.Errorf("%w: the server purged the binlog file %s the stream needs: events may be missing from the log; run 'txoutbox log recover' to hand them to the table's retry path", ErrLagging, st.Position.File)
	case !st.Exists && st.DefaultSet:
		return fmt.Errorf("%w: stream %s has no position but published_at's default hands rows to the log: run 'txoutbox log create'", ErrLagging, st.Name)
	}
	return nil
}

func (a *app) logRecoverCommand() *cobra.Command {
	var n logNames
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "MySQL/MariaDB: after the binlog the stream needed was purged, hand the events since its position to the table's retry path",
		Long: `recover is the way back when a log relay stops with "the binlog the stream
needs was purged" (txoutbox_log_binlog_purged 1): it moves the stream's
position to the server's current one, then hands the rows handed to the log
since a minute before the stored position's last event to the table's retry
path, where the relay's table half publishes them. Events come again at least
once (consumers' inboxes drop the ones that had arrived); none is skipped, as
long as cleanup has not deleted the rows: keep --retention longer than a
stream may be down.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dsn, d, err := a.logDSN()
			if err != nil {
				return err
			}
			if d != dialect.MySQL {
				return usagef("log recover is MySQL's and MariaDB's; PostgreSQL's slot keeps its WAL (see 'txoutbox log status')")
			}
			handed, err := binlogrelay.Recover(cmd.Context(), dsn, n.binlog(a.table))
			if err != nil {
				return logModeError(err)
			}
			fmt.Fprintf(a.stdout, "stream %s moved to the server's position; %d events handed to the table's retry path\n", n.stream, handed)
			return nil
		},
	}
	n.register(cmd)
	return cmd
}
