package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/txoutbox/txoutbox/dialect"
)

func (a *app) migrateCommand() *cobra.Command {
	var (
		inboxTable, migrationsTable, dialectName string
		skipInbox, skipOutbox, print             bool
		partitioned, skipOrdered, orderedFlag    bool
		ahead                                    int
		mode                                     string
		logN                                     logNames
		lookupIndexes                            bool
	)
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the outbox and inbox tables",
		Long: `migrate applies the outbox and inbox migrations that the database lacks and
records them in the migrations table. It is idempotent and safe to run from
several processes at once (e.g. every replica's init container): the second one
waits for the first and finds nothing left to do.

With --print it applies nothing and prints the SQL instead, for teams that run
their own migration tool (goose, Atlas, Flyway).

With --partitioned (PostgreSQL) the outbox table is partitioned by day of
created_at, and retention drops whole partitions instead of deleting rows:
no DELETE, no VACUUM debt. Pass --partitioned to cleanup (and relay
--cleanup-interval) for such a table too; they also create the partitions
ahead. Decide before the table exists: an existing plain table is not
converted.

It also creates what ordered mode needs (on by default with Kafka and SNS
FIFO): two partial indexes for the ordered claim and, on PostgreSQL, the
partition lease tables. An outbox that is only ever relayed unordered can
leave them out with --skip-ordered, sparing producers one index entry per
event.

With --mode log it then sets up log mode, as 'txoutbox log create' does: on
PostgreSQL the publication, the slot (--slot), then the trigger that sends
every insert into the outbox table to the write-ahead log; on MySQL and
MariaDB the stream's binlog position (--stream) and published_at's default.
See 'txoutbox log --help'.`,
		Example: `  txoutbox migrate --dsn 'postgres://app:secret@localhost:5432/app?sslmode=disable'

  # A producer-only database, with a custom table name:
  txoutbox migrate --table billing.outbox --skip-inbox

  # An outbox relayed only unordered (RabbitMQ), without ordered mode's index:
  txoutbox migrate --skip-ordered

  # A high-volume outbox: one partition per day, retention by DROP.
  txoutbox migrate --partitioned

  # Log mode: the relay streams events from the WAL (txoutbox relay --mode log).
  txoutbox migrate --mode log

  # Hand the SQL to your migration tool instead:
  txoutbox migrate --print --dialect postgres > 0001_txoutbox.sql`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := dialect.MigrateOptions{
				Table: a.table, InboxTable: inboxTable, MigrationsTable: migrationsTable,
				SkipInbox: skipInbox, SkipOutbox: skipOutbox, SkipOrdered: skipOrdered, LookupIndexes: lookupIndexes, Logger: a.log,
			}
			if orderedFlag && skipOrdered {
				return usagef("--ordered and --skip-ordered contradict each other (ordered mode's schema is part of the default migrations)")
			}
			if mode != "table" && mode != "log" {
				return usagef("--mode %q: want table or log", mode)
			}
			if mode == "log" && (print || skipOutbox) {
				return usagef("--mode log sets up a slot on a live database: it cannot be printed, and needs the outbox")
			}
			if skipInbox && skipOutbox {
				return usagef("--skip-inbox and --skip-outbox together leave nothing to migrate")
			}
			if print {
				d, err := a.printDialect(dialectName)
				if err != nil {
					return err
				}
				var ms []dialect.Migration
				if partitioned && !skipOutbox {
					pms, err := dialect.PartitionedMigrations(d, partitionOptions(a, ahead, migrationsTable, skipOrdered))
					if err != nil {
						return err
					}
					ms = pms
					opts.SkipOutbox = true
				}
				if !opts.SkipInbox || !opts.SkipOutbox {
					more, err := dialect.Migrations(d, opts)
					if err != nil {
						return err
					}
					ms = append(ms, more...)
				}
				for _, m := range ms {
					fmt.Fprintf(a.stdout, "-- %s %s v%d: %s\n%s\n\n", m.Component, m.Table, m.Version, m.Name, m.SQL)
				}
				return nil
			}
			dsn, err := a.requireDSN()
			if err != nil {
				return err
			}
			db, err := openDatabase(cmd.Context(), dsn)
			if err != nil {
				return err
			}
			defer db.Close()
			start := time.Now()
			if partitioned && !skipOutbox {
				if err := dialect.MigratePartitioned(cmd.Context(), db.db, db.dialect, partitionOptions(a, ahead, migrationsTable, skipOrdered)); err != nil {
					return fmt.Errorf("migrate partitioned outbox on %s: %w", db.redacted, err)
				}
				opts.SkipOutbox = true
			}
			if !opts.SkipInbox || !opts.SkipOutbox {
				if err := dialect.Migrate(cmd.Context(), db.db, db.dialect, opts); err != nil {
					return fmt.Errorf("migrate %s: %w", db.redacted, err)
				}
			}
			if mode == "log" {
				if err := a.setupLogMode(cmd.Context(), logN, "log mode set up on %s, table %s: "); err != nil {
					return err
				}
			}
			a.log.Info("txoutbox: migrations applied", "database", db.redacted, "dialect", db.dialect.Name(),
				"table", a.table, "inbox", !skipInbox, "took", time.Since(start).Round(time.Millisecond))
			fmt.Fprintf(a.stdout, "migrated %s (%s): outbox table %s%s\n", db.redacted, db.dialect.Name(), a.table,
				map[bool]string{true: "", false: ", inbox table " + orDefault(inboxTable, dialect.DefaultInboxTable)}[skipInbox])
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&inboxTable, "inbox-table", dialect.DefaultInboxTable, "inbox (processed events) table name")
	f.StringVar(&migrationsTable, "migrations-table", dialect.DefaultMigrationsTable, "table that records applied migrations")
	f.BoolVar(&skipInbox, "skip-inbox", false, "leave the inbox table out (producer-only database)")
	f.BoolVar(&skipOutbox, "skip-outbox", false, "leave the outbox table out (consumer-only database)")
	f.BoolVar(&print, "print", false, "print the SQL instead of applying it (needs no database)")
	f.BoolVar(&skipOrdered, "skip-ordered", false, "leave out ordered mode's indexes and lease tables (an outbox relayed only unordered)")
	f.BoolVar(&orderedFlag, "ordered", false, "no effect: ordered mode's schema is part of the default migrations")
	_ = f.MarkDeprecated("ordered", "ordered mode's schema is now part of the default migrations; drop the flag")
	f.BoolVar(&partitioned, "partitioned", false, "PostgreSQL: partition the outbox table by day (retention drops partitions)")
	f.IntVar(&ahead, "partitions-ahead", dialect.DefaultPartitionsAhead, "with --partitioned: daily partitions kept created ahead, today included")
	f.BoolVar(&lookupIndexes, "lookup-indexes", false, "also index event_id and (aggregate_id, id), for looking events up by ID or aggregate (the console); producers pay two more index entries per event")
	f.StringVar(&mode, "mode", "table", "table, or log: also set up log mode (PostgreSQL; see 'txoutbox log --help')")
	logN.register(cmd)
	f.StringVar(&dialectName, "dialect", "", "with --print: postgres, mysql or sqlite (default: from --dsn, else postgres)")
	return cmd
}

// printDialect chooses the dialect of migrate --print: the flag, else the
// DSN's, else PostgreSQL.
func (a *app) printDialect(name string) (dialect.Dialect, error) {
	if name != "" {
		d, err := dialect.ByName(name)
		if err != nil {
			return d, fmt.Errorf("%w: --dialect: %w", ErrUsage, err)
		}
		return d, nil
	}
	if a.dsn != "" {
		_, _, d, err := parseDSN(a.dsn)
		return d, err
	}
	slog.Debug("txoutbox: no --dialect or --dsn; printing PostgreSQL")
	return dialect.Postgres, nil
}

// partitionOptions are the options of a partitioned outbox table.
func partitionOptions(a *app, ahead int, migrationsTable string, skipOrdered bool) dialect.PartitionOptions {
	return dialect.PartitionOptions{Table: a.table, Ahead: ahead, MigrationsTable: migrationsTable, SkipOrdered: skipOrdered, Logger: a.log}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
