// Package sqlxoutbox is txoutbox's storage adapter for database/sql and
// github.com/jmoiron/sqlx, on PostgreSQL, MySQL/MariaDB and SQLite.
//
// An Outbox writes events in the caller's transaction (Enqueue) and is the
// core.Store the relay claims them from. It also reads Stats, deletes old
// published events (core.Cleaner), and lists, re-queues, purges and replays
// events for operators. The SQL comes from package dialect; create the tables
// with dialect.Migrate.
//
// # PostgreSQL
//
// Use the pgx driver (github.com/jackc/pgx/v5/stdlib, driver name "pgx").
// A claim is a transaction holding SELECT ... FOR UPDATE SKIP LOCKED row
// locks until the outcome is committed, so any number of relays may run
// against one table; a crashed relay's locks go with its connection. Each
// relay worker holds one pooled connection while it publishes a batch: size
// the pool for the producers plus the relay's Concurrency.
//
// # MySQL and MariaDB
//
// Use github.com/go-sql-driver/mysql (driver name "mysql"), MySQL 8.0.13 or
// later, or MariaDB 10.6 or later, with InnoDB tables. A claim is a READ
// COMMITTED transaction holding SELECT ... FOR UPDATE SKIP LOCKED row locks
// until its outcome is written, as on PostgreSQL, so that several relays
// share one table; it marks its events in one UPDATE when the batch is
// done (MySQL has no UPDATE ... RETURNING to mark as it claims). Enqueue
// reads the assigned Seqs back with a second statement. interpolateParams=true
// in the DSN saves a round trip per statement (the driver otherwise
// prepares each one). See docs/mysql.md.
//
// # SQLite
//
// Use modernc.org/sqlite (driver name "sqlite"), and open the database with
// WAL and a busy timeout, and with immediate transactions, so that writers
// queue instead of failing with SQLITE_BUSY:
//
//	file:app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate
//
// WAL lets the relay read while a producer writes; busy_timeout makes a
// writer wait for the lock instead of failing at once; _txlock=immediate
// takes the write lock at BEGIN, so a transaction that reads and then writes
// cannot fail half-way with SQLITE_BUSY. WAL mode is stored in the file; the
// first switch to it needs the file to itself and does not wait on
// busy_timeout, so make it once at start-up (dialect.Migrate's connection
// does) before starting concurrent writers.
//
// SQLite has one writer at a time. A claim is therefore not a transaction but
// one short UPDATE that stamps a lease (claimed_until) on the rows: producers
// are not blocked while a slow broker publishes. The Outbox reports a
// MaxConcurrency of 1, so a relay runs one worker; an abandoned claim becomes
// claimable again when its lease (Options.ClaimLease) expires.
//
// # Ordered claims and wake-up
//
// The same Outbox serves the ordered claims of ordered mode
// (core.ClaimRequest.Ordered; docs/ordering.md) and, on PostgreSQL, the
// partition leaser that relays of one table share (package ordered): a
// relay with the default core.OrderingAuto and a Kafka or SNS FIFO
// publisher is ordered with no extra wiring. Every write through an Outbox
// (or the GORM plugin) on the same *sql.DB and table wakes the relays
// running on it in this process (core.WakeupSource).
package sqlxoutbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/poolwatch"
	"github.com/txoutbox/txoutbox/internal/sqlclaim"
	"github.com/txoutbox/txoutbox/internal/wake"
	"github.com/txoutbox/txoutbox/ordered"
)

// DefaultClaimLease is the default lease of a claim on SQLite.
const DefaultClaimLease = time.Minute

// Filters of the operator methods, re-exported from package dialect.
type (
	// DeadFilter selects dead-lettered events; see dialect.DeadFilter.
	DeadFilter = dialect.DeadFilter
	// ReplayFilter selects published events to replay; see
	// dialect.ReplayFilter.
	ReplayFilter = dialect.ReplayFilter
	// Page bounds a listing; see dialect.Page.
	Page = dialect.Page
	// EventFilter selects events to list; see dialect.EventFilter.
	EventFilter = dialect.EventFilter
	// EventPage bounds a listing newest first; see dialect.EventPage.
	EventPage = dialect.EventPage
	// DeadGroup is the dead events of one type and error; see
	// dialect.DeadGroup.
	DeadGroup = dialect.DeadGroup
)

// Tx is where Enqueue writes: the caller's transaction, a *sql.Tx or a
// *sqlx.Tx (or a wrapper of one). A *sql.DB or *sql.Conn (or their sqlx
// forms) has the same methods but is not a transaction: Enqueue refuses it
// with core.ErrNoTransaction, since an event written outside the business
// transaction is the dual-write bug the outbox exists to remove.
type Tx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Options configures an Outbox. Zero fields take their defaults.
type Options struct {
	// Dialect of the database. Default: detected from the driver (pgx, lib/pq,
	// modernc.org/sqlite, mattn/go-sqlite3); New fails when it cannot tell.
	Dialect dialect.Dialect
	// Table is the outbox table, validated by dialect.ValidateIdentifier.
	// Default dialect.DefaultTable.
	Table string
	// Notifier is told after each successful Enqueue, besides the relays of
	// this process (which are woken without it): use it to reach relays in
	// other processes, with pgnotify.Notifier. The relay copes with hearing
	// of events before their transaction commits.
	Notifier core.Notifier
	// Hooks run on every event before it is validated and written
	// (core.EnqueueHook).
	Hooks []core.EnqueueHook
	// Limits bound the events Enqueue accepts (core.Limits); an event
	// beyond them is refused before anything is written. Default
	// core.DefaultLimits.
	Limits core.Limits
	// ClaimLease is how long a claim keeps its events from other claims on
	// SQLite before they count as abandoned. It must exceed the longest
	// publish of a batch. Default DefaultClaimLease. Unused on PostgreSQL,
	// where the claim's row locks last exactly as long as the claim.
	ClaimLease time.Duration
	// SyncMark makes the relay's claims wait for the WAL flush of their
	// commit. By default (false) on PostgreSQL a claim's transaction, which
	// marks its events published or records their failures, commits with
	// synchronous_commit off, set in the claim statement itself (no extra
	// round trip): the relay does not wait for the flush, and producers'
	// commits do not queue behind its flushes. A mark lost in a crash of the
	// database (at most wal_writer_delay × 3 of marks, 600 ms by default)
	// leaves its events pending: they are published again, as after any
	// crash between publish and mark, and the consumers' inbox drops the
	// duplicates. Producers' transactions keep the server's setting. Set
	// SyncMark when a duplicate after a database crash costs more than the
	// relay's waits. No effect on SQLite.
	SyncMark bool
	// SkipReadBack makes Enqueue leave the events' Seq and CreatedAt zero
	// instead of reading them back from the inserted rows: the IDs, which
	// Enqueue assigns, are still written back. It spares the producer
	// reading rows (on PostgreSQL and SQLite a RETURNING clause, through
	// database/sql's rows: 7-9 % of a short transaction's throughput in
	// the bench's row d') and, on MySQL, a second statement (the
	// read-back SELECT). Set it when the producer does not use Seq or
	// CreatedAt after Enqueue; tests asserting on them should not.
	SkipReadBack bool
	// DeleteOnPublish makes the relay delete each event's row once the
	// broker has taken it, in the claim's transaction, instead of marking
	// it published. Failed events are kept and retried as without it, and
	// dead letters stay until they are purged. It is for outboxes that keep
	// no history: published events are gone at once from Stats, the
	// console, archive and replay, and cleanup has nothing left to delete.
	// On PostgreSQL the claim then locks the rows and the commit deletes
	// them, which docs/performance.md measures against a claim that marks
	// them. A producer that enqueues an event ID again after its row was
	// deleted is not refused.
	DeleteOnPublish bool
	// Logger receives the adapter's warnings. Default slog.Default().
	Logger *slog.Logger
}

// Outbox is the outbox table of one database: the producers' Enqueue, the
// relay's core.Store, and the operators' tools. It is safe for concurrent
// use.
type Outbox struct {
	db     *sql.DB
	d      dialect.Dialect
	q      *dialect.Queries
	opts   Options
	limits core.Limits
	wake   *core.Signal
	// claims opens and finishes the relay's claims (claim.go).
	claims *sqlclaim.Claimer
	// native: claims run on pgx's connections ((*sqlclaim.Claimer).QueryMarkedNative).
	native bool
	// partitionLocks holds the partition counts whose lock rows exist
	// (MySQL: ensurePartitionLocks).
	partitionLocks sync.Map
	// inLogMode: an insert found the table in log mode (logMode).
	inLogMode atomic.Bool
	// pool notices, at each Stats, a pool that keeps too few idle
	// connections for its users.
	pool poolwatch.Watch
}

// What the relay, the monitor and retention find on an Outbox.
var (
	_ core.Store         = (*Outbox)(nil)
	_ core.StatsReader   = (*Outbox)(nil)
	_ core.Cleaner       = (*Outbox)(nil)
	_ core.WakeupSource  = (*Outbox)(nil)
	_ core.NextDueReader = (*Outbox)(nil)
	_ core.LeaserSource  = (*Outbox)(nil)
)

// New returns the Outbox of a sqlx database; the dialect defaults to the one
// of db's driver name.
func New(db *sqlx.DB, opts Options) (*Outbox, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: sqlxoutbox.New needs a *sqlx.DB", core.ErrInvalidOptions)
	}
	if opts.Dialect.IsZero() {
		if d, err := dialect.ByName(db.DriverName()); err == nil {
			opts.Dialect = d
		}
	}
	return NewDB(db.DB, opts)
}

// NewDB returns the Outbox of a database/sql database; the dialect defaults
// to the one of db's driver.
func NewDB(db *sql.DB, opts Options) (*Outbox, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: sqlxoutbox.NewDB needs a *sql.DB", core.ErrInvalidOptions)
	}
	if opts.Dialect.IsZero() {
		d, err := detect(db)
		if err != nil {
			return nil, err
		}
		opts.Dialect = d
	}
	if opts.ClaimLease < 0 {
		return nil, fmt.Errorf("%w: negative ClaimLease", core.ErrInvalidOptions)
	}
	if opts.ClaimLease == 0 {
		opts.ClaimLease = DefaultClaimLease
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	limits, err := opts.Limits.WithDefaults()
	if err != nil {
		return nil, err
	}
	q, err := opts.Dialect.Queries(opts.Table)
	if err != nil {
		return nil, err
	}
	return &Outbox{
		db: db, d: opts.Dialect, q: q, opts: opts, limits: limits, wake: wake.For(db, q.Table().String()),
		claims: &sqlclaim.Claimer{DB: db, Q: q, Log: opts.Logger, Prefix: "sqlxoutbox", AsyncMark: !opts.SyncMark,
			Delete: opts.DeleteOnPublish, TxOptions: opts.Dialect.ClaimTxOptions()},
		native: opts.Dialect.ClaimMode() == dialect.ClaimRowLocks && sqlclaim.Native(db),
	}, nil
}

// detect tells the dialect from the package of the driver's type, which is
// all database/sql reveals of a driver.
func detect(db *sql.DB) (dialect.Dialect, error) {
	t := reflect.TypeOf(db.Driver())
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	pkg := t.PkgPath()
	switch {
	case strings.Contains(pkg, "jackc/pgx"), strings.Contains(pkg, "lib/pq"):
		return dialect.Postgres, nil
	case strings.Contains(pkg, "go-sql-driver/mysql"):
		return dialect.MySQL, nil
	case strings.Contains(pkg, "sqlite"):
		return dialect.SQLite, nil
	}
	return dialect.Dialect{}, fmt.Errorf("%w: cannot tell the dialect of driver %s; set Options.Dialect", dialect.ErrUnknownDialect, pkg)
}

// DB returns the database the Outbox uses.
func (o *Outbox) DB() *sql.DB { return o.db }

// Dialect returns the Outbox's dialect.
func (o *Outbox) Dialect() dialect.Dialect { return o.d }

// Queries returns the SQL the Outbox runs.
func (o *Outbox) Queries() *dialect.Queries { return o.q }

// Capabilities implements core.Store: ordered claims on every dialect; one
// claim at a time, of every partition, on SQLite (one writer); on
// PostgreSQL and MySQL ordered claims of chosen partitions, which relays
// of one table share with the leaser of NewLeaser.
func (o *Outbox) Capabilities() core.StoreCapabilities {
	return core.StoreCapabilities{
		OrderedClaims:     true,
		OrderedPartitions: o.d.ClaimMode() == dialect.ClaimRowLocks,
		MaxConcurrency:    o.d.MaxConcurrency(),
	}
}

// Wakeups implements core.WakeupSource: the signal shared by every writer
// of the table in this process.
func (o *Outbox) Wakeups() *core.Signal { return o.wake }

// NewLeaser implements core.LeaserSource with the partition leaser of
// package ordered on the table; SQLite, whose one writer serves every
// partition, has none (an error wrapping core.ErrUnsupported).
func (o *Outbox) NewLeaser(lc core.LeaserConfig) (core.PartitionLeaser, error) {
	return ordered.NewLeaser(o.db, o.d, ordered.LeaserOptions{
		Table: o.q.Table().String(), PartitionCount: lc.PartitionCount, Logger: lc.Logger,
	})
}

// checkTx refuses a handle that is not a transaction.
func checkTx(tx Tx, call string) error {
	switch tx.(type) {
	case nil:
		return fmt.Errorf("%w: %s needs the caller's transaction, got nil", core.ErrNoTransaction, call)
	case *sql.DB, *sqlx.DB, *sql.Conn, *sqlx.Conn:
		return fmt.Errorf("%w: %s needs the caller's transaction (*sql.Tx or *sqlx.Tx), got %T: "+
			"an event written outside the business transaction can be lost or published for a write that rolled back",
			core.ErrNoTransaction, call, tx)
	}
	return nil
}

// notify wakes the relays of this process and the Notifier.
func (o *Outbox) notify() {
	o.wake.Notify()
	if o.opts.Notifier != nil {
		o.opts.Notifier.Notify()
	}
}

// Enqueue writes events in the caller's transaction tx, so that they are
// published if and only if tx commits. It prepares every event (a UUIDv7 ID
// when none is set, the Hooks, validation against the Limits) before
// anything is written: an invalid event fails the call with an error
// wrapping core.ErrInvalidEvent that names the field and the limit, and tx
// stays usable for the caller's other writes. It then writes the events
// with one multi-row INSERT per dialect.MaxInsertRows events. A tx that is
// not a transaction fails with core.ErrNoTransaction.
//
// The IDs, and the Seq and CreatedAt the database assigned (unless
// Options.SkipReadBack), are written back into events: pass a slice
// (Enqueue(ctx, tx, evs...)) to see them.
// Enqueue then wakes the relays of this process (and the Notifier), before
// tx commits.
func (o *Outbox) Enqueue(ctx context.Context, tx Tx, events ...core.Event) error {
	if err := checkTx(tx, "Enqueue"); err != nil {
		return err
	}
	if len(events) == 0 {
		return nil
	}
	if err := o.write(ctx, tx, events, true); err != nil {
		return err
	}
	o.notify()
	return nil
}

// write is Enqueue without the notification.
func (o *Outbox) write(ctx context.Context, tx Tx, events []core.Event, readBack bool) error {
	if err := o.d.PrepareEvents(ctx, events, o.limits, o.opts.Hooks); err != nil {
		return err
	}
	for start := 0; start < len(events); start += dialect.MaxInsertRows {
		chunk := events[start:min(start+dialect.MaxInsertRows, len(events))]
		var err error
		if readBack {
			err = o.insert(ctx, tx, chunk)
		} else {
			err = o.insertOnly(ctx, tx, chunk)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ExecWithEvents runs the caller's write statement query (with args) in tx
// and writes events with it, so that they are published if and only if tx
// commits, like Enqueue. On PostgreSQL the events' INSERT rides on the
// statement itself as a data-modifying WITH query (see
// dialect.Queries.InsertWith): the business write and its events cost one
// round trip instead of two, which is most of what an outbox adds to a
// short producer transaction. Elsewhere, and for more than
// dialect.MaxInsertRows events, it inserts the events (as Enqueue with
// SkipReadBack) and then runs the statement.
//
// query must be a single INSERT, UPDATE, DELETE or SELECT, optionally with a
// WITH clause of its own, numbering its placeholders $1 to $len(args); the
// events' parameters are numbered after them. Anything else fails with an
// error wrapping dialect.ErrNotAttachable before anything is written. The
// result is the statement's own.
//
// The events' IDs are written back into events as by Enqueue; their Seq and
// CreatedAt are left zero (the statement returns no rows of its own, and
// reading them back would cost MySQL and SQLite a statement more). The
// Notifier is told after the statement succeeded.
func (o *Outbox) ExecWithEvents(ctx context.Context, tx Tx, query string, args []any, events ...core.Event) (sql.Result, error) {
	if err := checkTx(tx, "ExecWithEvents"); err != nil {
		return nil, err
	}
	if len(events) == 0 {
		return tx.ExecContext(ctx, query, args...)
	}
	var res sql.Result
	if !o.d.DataModifyingWith() || len(events) > dialect.MaxInsertRows {
		// No read-back here either: the one-statement path returns
		// no rows of its own, and on MySQL it would cost a statement.
		if err := o.write(ctx, tx, events, false); err != nil {
			return nil, err
		}
		var err error
		if res, err = tx.ExecContext(ctx, query, args...); err != nil {
			return nil, err
		}
	} else {
		if err := o.d.PrepareEvents(ctx, events, o.limits, o.opts.Hooks); err != nil {
			return nil, err
		}
		stmt, evArgs, err := o.q.InsertWith(query, len(args), events)
		if err != nil {
			return nil, err
		}
		all := make([]any, 0, len(args)+len(evArgs))
		all = append(append(all, args...), evArgs...)
		if res, err = tx.ExecContext(ctx, stmt, all...); err != nil {
			return nil, fmt.Errorf("sqlxoutbox: statement with %d events: %w", len(events), err)
		}
	}
	o.notify()
	return res, nil
}

// logMode reports whether the table carries log mode's trigger
// (dialect.LogTrigger), which keeps inserted events out of the table. A
// positive answer is kept: a table leaves log mode by a teardown after
// which inserts return their rows again.
func (o *Outbox) logMode(ctx context.Context, tx Tx) (bool, error) {
	if o.inLogMode.Load() {
		return true, nil
	}
	rows, err := tx.QueryContext(ctx, o.q.LogMode())
	if err != nil {
		return false, fmt.Errorf("sqlxoutbox: insert returned no rows; look for log mode's trigger: %w", err)
	}
	defer rows.Close()
	var ok bool
	if rows.Next() {
		if err := rows.Scan(&ok); err != nil {
			return false, fmt.Errorf("sqlxoutbox: look for log mode's trigger: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("sqlxoutbox: look for log mode's trigger: %w", err)
	}
	o.inLogMode.Store(ok)
	return ok, nil
}

// insertOnly is insert without reading the rows back (SkipReadBack): one
// statement, its count of rows checked.
func (o *Outbox) insertOnly(ctx context.Context, tx Tx, events []core.Event) error {
	query, args, err := o.q.InsertNoReturning(events)
	if err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("sqlxoutbox: insert %d events: %w", len(events), dialect.CheckMigrated(err, o.q.Table()))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("sqlxoutbox: insert %d events: %w", len(events), err)
	}
	_, err = o.checkInserted(ctx, tx, int(n), len(events))
	return err
}

// checkInserted checks that an insert of want events wrote n rows. No rows
// on PostgreSQL can be log mode's trigger at work (the events went to the
// WAL, not the table): then it reports logMode.
func (o *Outbox) checkInserted(ctx context.Context, tx Tx, n, want int) (logMode bool, err error) {
	if n == 0 && o.d == dialect.Postgres {
		if ok, err := o.logMode(ctx, tx); err != nil || ok {
			return ok, err
		}
	}
	if n != want {
		return false, fmt.Errorf("sqlxoutbox: insert of %d events wrote %d rows", want, n)
	}
	return false, nil
}

type inserted struct {
	seq     int64
	created dialect.Time
}

func (o *Outbox) insert(ctx context.Context, tx Tx, events []core.Event) error {
	if o.opts.SkipReadBack {
		return o.insertOnly(ctx, tx, events)
	}
	query, args, err := o.q.Insert(events)
	if err != nil {
		return err
	}
	if !o.d.ReturnsInserted() {
		res, err := tx.ExecContext(ctx, query, args...)
		if err != nil {
			return fmt.Errorf("sqlxoutbox: insert %d events: %w", len(events), dialect.CheckMigrated(err, o.q.Table()))
		}
		first, err := res.LastInsertId()
		if err != nil {
			return fmt.Errorf("sqlxoutbox: insert %d events: %w", len(events), err)
		}
		if query, args, err = o.q.InsertedRows(first, events); err != nil {
			return err
		}
	}
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("sqlxoutbox: insert %d events: %w", len(events), dialect.CheckMigrated(err, o.q.Table()))
	}
	defer rows.Close()
	got := make([]inserted, 0, len(events))
	dest := []any{nil, nil}
	var eventID string
	if !o.d.ReturnsInserted() {
		dest = append(dest, &eventID) // InsertedRows matches rows by it
	}
	for rows.Next() {
		var r inserted
		dest[0], dest[1] = &r.seq, &r.created
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("sqlxoutbox: insert %d events: %w", len(events), err)
		}
		got = append(got, r)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("sqlxoutbox: insert %d events: %w", len(events), err)
	}
	if logMode, err := o.checkInserted(ctx, tx, len(got), len(events)); err != nil || logMode {
		return err
	}
	// Ids are assigned in VALUES order; RETURNING order is not promised.
	slices.SortFunc(got, func(a, b inserted) int { return cmp.Compare(a.seq, b.seq) })
	for i := range events {
		events[i].Seq = got[i].seq
		events[i].CreatedAt = got[i].created.Time
		events[i].NextAttemptAt = got[i].created.Time
	}
	return nil
}
