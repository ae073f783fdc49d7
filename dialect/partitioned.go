package dialect

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// ComponentOutboxPartitioned is the migrations component of an outbox
// table partitioned by day (MigratePartitioned). It is versioned apart from
// ComponentOutbox: a table is created by one or the other.
const ComponentOutboxPartitioned = "outbox_partitioned"

// errPartitionsUnsupported (core.ErrUnsupported) is returned for a
// partitioned outbox on a dialect other than PostgreSQL.
var errPartitionsUnsupported = fmt.Errorf("%w: dialect: a partitioned outbox needs PostgreSQL", core.ErrUnsupported)

// DefaultPartitionsAhead is how many daily partitions, today's included,
// EnsurePartitions keeps created when PartitionOptions.Ahead is zero.
const DefaultPartitionsAhead = 7

// pgPartitionLockKey serializes partition maintenance across processes
// (pgMigrateLockKey + 1), so that two relays' cleanups never race on DDL.
const pgPartitionLockKey = pgMigrateLockKey + 1

// partitionDayFormat is the day suffix of a daily partition's name.
const partitionDayFormat = "20060102"

// PartitionOptions configures a partitioned outbox table (PostgreSQL only).
//
// The table has the columns and indexes of the plain outbox, so every store
// (sqlxoutbox, the GORM store) works on it unchanged; it is partitioned by
// RANGE of created_at, one partition per UTC day named <table>_pYYYYMMDD, plus
// a DEFAULT partition (<table>_default) that catches rows no daily partition
// covers so that a producer never fails when maintenance falls behind.
//
// Retention then drops whole partitions (DropPartitions, or
// PartitionMaintainer as the core.Cleaner of core.RunCleanup) instead of
// deleting rows: no DELETE, no WAL for the deleted rows, no VACUUM debt.
type PartitionOptions struct {
	// Table is the outbox table. Default DefaultTable.
	Table string
	// Ahead is the number of daily partitions, today's (UTC) included,
	// that EnsurePartitions keeps created. Default DefaultPartitionsAhead.
	// Keep it at 2 or more, so that a database clock a little ahead of
	// the application's at midnight still finds its partition.
	Ahead int
	// MigrationsTable records applied versions. Default
	// DefaultMigrationsTable.
	MigrationsTable string
	// SkipOrdered leaves out what ordered mode needs, as
	// MigrateOptions.SkipOrdered.
	SkipOrdered bool
	// LockTimeout bounds how long a partition drop waits for its locks
	// (an open claim on a partition holds one); the drop is tried again on
	// the next pass. Default 5s.
	LockTimeout time.Duration
	// Logger receives one line per applied migration, created and dropped
	// partition. Default slog.Default().
	Logger *slog.Logger
}

func (o PartitionOptions) withDefaults() (PartitionOptions, Identifier, error) {
	if o.Table == "" {
		o.Table = DefaultTable
	}
	id, err := ValidateIdentifier(o.Table)
	if err != nil {
		return o, id, err
	}
	if o.Ahead < 0 || o.LockTimeout < 0 {
		return o, id, fmt.Errorf("dialect: negative Ahead or LockTimeout")
	}
	if o.Ahead == 0 {
		o.Ahead = DefaultPartitionsAhead
	}
	if o.LockTimeout == 0 {
		o.LockTimeout = 5 * time.Second
	}
	if o.MigrationsTable == "" {
		o.MigrationsTable = DefaultMigrationsTable
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, id, nil
}

// PartitionedMigrations returns the migrations of a partitioned outbox
// table, for users who run their own migration tool. Daily partitions are
// not migrations: create them with EnsurePartitions.
func PartitionedMigrations(d Dialect, opts PartitionOptions) ([]Migration, error) {
	if d.kind != kindPostgres {
		return nil, errPartitionsUnsupported
	}
	_, id, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	ms, err := d.render(ComponentOutboxPartitioned, id)
	if err != nil || opts.SkipOrdered {
		return ms, err
	}
	ord, err := d.render(ComponentOrdered, id)
	if err != nil {
		return nil, err
	}
	return append(ms, ord...), nil
}

// MigratePartitioned creates (or brings up to date) a partitioned outbox
// table on PostgreSQL and then its daily partitions (EnsurePartitions). Like
// Migrate it is idempotent, safe to run from several processes at once, and
// records versions in the migrations table, under
// ComponentOutboxPartitioned. Create the inbox with Migrate (SkipOutbox).
func MigratePartitioned(ctx context.Context, db *sql.DB, d Dialect, opts PartitionOptions) error {
	ms, err := PartitionedMigrations(d, opts)
	if err != nil {
		return err
	}
	o, _, err := opts.withDefaults()
	if err != nil {
		return err
	}
	if err := d.applyMigrations(ctx, db, ms, MigrateOptions{MigrationsTable: o.MigrationsTable, Logger: o.Logger}); err != nil {
		return err
	}
	_, err = EnsurePartitions(ctx, db, d, opts, time.Now())
	return err
}

// partitionName is the unquoted name of the partition of day (UTC).
func partitionName(table string, day time.Time) string {
	return indexName(table, "p"+day.UTC().Format(partitionDayFormat))
}

// partitionDay parses a partition name made by partitionName for table.
func partitionDay(table, name string) (time.Time, bool) {
	i := strings.LastIndex(name, "_p")
	if i < 0 || len(name)-i-2 != len(partitionDayFormat) {
		return time.Time{}, false
	}
	day, err := time.Parse(partitionDayFormat, name[i+2:])
	if err != nil || partitionName(table, day) != name {
		return time.Time{}, false
	}
	return day, true
}

func (d Dialect) partitionIdent(id Identifier, name string) string {
	return d.qualified(Identifier{Schema: id.Schema, Name: name})
}

// EnsurePartitions creates the daily partitions of the Ahead days starting
// with the UTC day of now, those that do not exist yet, and returns the
// names of those it created. Call it daily or more often (MigratePartitioned
// and PartitionMaintainer do). It fails if the DEFAULT partition already
// holds rows of a day it would create: move them out first (or let them be
// deleted by the store's DeletePublished once published).
func EnsurePartitions(ctx context.Context, db *sql.DB, d Dialect, opts PartitionOptions, now time.Time) (created []string, err error) {
	if d.kind != kindPostgres {
		return nil, errPartitionsUnsupported
	}
	o, id, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("dialect: ensure partitions: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", pgPartitionLockKey); err != nil {
		return nil, fmt.Errorf("dialect: ensure partitions: lock: %w", err)
	}
	today := now.UTC().Truncate(24 * time.Hour)
	for i := range o.Ahead {
		day := today.AddDate(0, 0, i)
		name := partitionName(id.Name, day)
		qname := d.partitionIdent(id, name)
		var exists bool
		if err := tx.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", qname).Scan(&exists); err != nil {
			return nil, fmt.Errorf("dialect: ensure partitions: %w", err)
		}
		if exists {
			continue
		}
		// Bounds are literals (DDL takes no parameters), built from
		// time.Time values only.
		from, to := day.Format("2006-01-02 15:04:05Z07:00"), day.AddDate(0, 0, 1).Format("2006-01-02 15:04:05Z07:00")
		if _, err := tx.ExecContext(ctx, "CREATE TABLE "+qname+" PARTITION OF "+d.qualified(id)+
			" FOR VALUES FROM ('"+from+"') TO ('"+to+"')"); err != nil {
			return nil, fmt.Errorf("dialect: create partition %s of %s: %w", name, id, err)
		}
		created = append(created, name)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("dialect: ensure partitions: commit: %w", err)
	}
	for _, name := range created {
		o.Logger.Info("txoutbox: created outbox partition", "table", id.String(), "partition", name)
	}
	return created, nil
}

// PartitionDrop is what DropPartitions did.
type PartitionDrop struct {
	// Dropped are the partitions dropped, oldest first.
	Dropped []string
	// Rows is the number of events the dropped partitions held.
	Rows int64
	// Kept are partitions old enough to drop that still hold pending or
	// dead events, or events published since the cut-off; they are dropped
	// on a later pass, once those are published (and old enough) or purged.
	Kept []string
}

// DropPartitions drops every daily partition whose day ended at or before
// before and whose events are all published before before: a partition
// holding a pending or dead-lettered event is never dropped, so retention
// cannot lose an undelivered event. The DEFAULT partition is never dropped.
// Each drop is its own transaction: it locks the partition (waiting at most
// LockTimeout), checks it through the partial indexes, counts its rows and
// drops it.
func DropPartitions(ctx context.Context, db *sql.DB, d Dialect, opts PartitionOptions, before time.Time) (PartitionDrop, error) {
	var res PartitionDrop
	if d.kind != kindPostgres {
		return res, errPartitionsUnsupported
	}
	o, id, err := opts.withDefaults()
	if err != nil {
		return res, err
	}
	rows, err := db.QueryContext(ctx, "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"+
		" WHERE i.inhparent = CAST($1 AS regclass) ORDER BY c.relname", d.qualified(id))
	if err != nil {
		return res, fmt.Errorf("dialect: list partitions of %s: %w", id, err)
	}
	var old []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return res, fmt.Errorf("dialect: list partitions of %s: %w", id, err)
		}
		if day, ok := partitionDay(id.Name, name); ok && !day.AddDate(0, 0, 1).After(before) {
			old = append(old, name)
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return res, fmt.Errorf("dialect: list partitions of %s: %w", id, err)
	}
	for _, name := range old {
		n, dropped, err := dropPartition(ctx, db, d, d.partitionIdent(id, name), before, o.LockTimeout)
		if err != nil {
			return res, fmt.Errorf("dialect: drop partition %s: %w", name, err)
		}
		if !dropped {
			res.Kept = append(res.Kept, name)
			o.Logger.Warn("txoutbox: outbox partition past retention still holds pending, dead or recently published events; kept",
				"table", id.String(), "partition", name)
			continue
		}
		res.Dropped = append(res.Dropped, name)
		res.Rows += n
		o.Logger.Info("txoutbox: dropped outbox partition", "table", id.String(), "partition", name, "events", n)
	}
	return res, nil
}

func dropPartition(ctx context.Context, db *sql.DB, d Dialect, qname string, before time.Time, lockTimeout time.Duration) (n int64, dropped bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, false, err
	}
	defer func() {
		if !dropped || err != nil {
			_ = tx.Rollback()
		}
	}()
	// SET takes no parameters; the value is an integer we formatted.
	if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = "+strconv.FormatInt(lockTimeout.Milliseconds(), 10)); err != nil {
		return 0, false, err
	}
	// The exclusive lock keeps a Replay or RetryDead from making an event
	// of the partition pending between the check and the drop.
	if _, err := tx.ExecContext(ctx, "LOCK TABLE "+qname+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		return 0, false, err
	}
	var busy bool
	if err := tx.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM "+qname+" WHERE published_at IS NULL AND dead_at IS NULL)"+
		" OR EXISTS (SELECT 1 FROM "+qname+" WHERE dead_at IS NOT NULL)"+
		" OR EXISTS (SELECT 1 FROM "+qname+" WHERE published_at >= $1)", d.TimeArg(before)).Scan(&busy); err != nil {
		return 0, false, err
	}
	if busy {
		return 0, false, nil
	}
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM "+qname).Scan(&n); err != nil {
		return 0, false, err
	}
	if _, err := tx.ExecContext(ctx, "DROP TABLE "+qname); err != nil {
		return 0, false, err
	}
	dropped = true
	if err := tx.Commit(); err != nil {
		return 0, false, err
	}
	return n, true, nil
}

// PartitionMaintainer is the retention of a partitioned outbox as a
// core.Cleaner: run it with core.RunCleanup (or core.Cleanup) in place of
// the store, and each pass creates the partitions ahead and drops the
// expired ones. Build it with NewPartitionMaintainer.
type PartitionMaintainer struct {
	db   *sql.DB
	d    Dialect
	opts PartitionOptions
	now  func() time.Time
}

// NewPartitionMaintainer returns the maintainer of the partitioned outbox
// of opts on db.
func NewPartitionMaintainer(db *sql.DB, d Dialect, opts PartitionOptions) (*PartitionMaintainer, error) {
	if d.kind != kindPostgres {
		return nil, errPartitionsUnsupported
	}
	if db == nil {
		return nil, fmt.Errorf("dialect: NewPartitionMaintainer needs a *sql.DB")
	}
	if _, _, err := opts.withDefaults(); err != nil {
		return nil, err
	}
	return &PartitionMaintainer{db: db, d: d, opts: opts, now: time.Now}, nil
}

// DeletePublished implements core.Cleaner: it creates the partitions ahead
// (EnsurePartitions), then drops the partitions whose events were all
// published before before (DropPartitions) and returns how many events
// they held. limit does not apply: a partition goes as a whole, which is
// the point (a drop costs about the same for ten rows or ten million).
func (m *PartitionMaintainer) DeletePublished(ctx context.Context, before time.Time, limit int) (int64, error) {
	if _, err := EnsurePartitions(ctx, m.db, m.d, m.opts, m.now()); err != nil {
		return 0, err
	}
	res, err := DropPartitions(ctx, m.db, m.d, m.opts, before)
	return res.Rows, err
}
