// Package pgxoutbox is txoutbox's storage adapter for services that use
// github.com/jackc/pgx/v5 directly, through pgx.Tx and *pgxpool.Pool, on
// PostgreSQL.
//
// An Outbox writes events in the caller's pgx.Tx (Enqueue, ExecWithEvents)
// and is the core.Store the relay claims them from, on a *pgxpool.Pool. It
// also reads Stats, deletes old published events, and lists, re-queues,
// purges and replays events for operators. A service needs no
// database/sql: the store borrows the pool's connections for every claim
// and query and gives them back after each. Create the tables with Migrate
// (or `txoutbox migrate`).
//
// The SQL, the claims and their guarantees are those of package sqlxoutbox
// on PostgreSQL (see its documentation): any number of relays may share a
// table; a claim is a transaction holding SELECT ... FOR UPDATE SKIP LOCKED
// row locks, sent with its BEGIN in one round trip on pgx's own
// connection; ordered claims and the partition leaser of package ordered
// work with no extra wiring. The two adapters may write to and relay from
// one table side by side.
//
// Every Enqueue, ExecWithEvents, RetryDead and Replay through an Outbox on
// a pool wakes the relays running on that pool and table in this process
// (core.WakeupSource). To wake relays in other processes, set
// Options.Notifier to a pgnotify.Notifier made with
// pgnotify.NewNotifierConfig(pool.Config().ConnConfig, ...).
package pgxoutbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/pgxbridge"
	"github.com/txoutbox/txoutbox/internal/sqlclaim"
)

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

// Options configures an Outbox. Zero fields take their defaults.
type Options struct {
	// Table is the outbox table, optionally schema-qualified, validated by
	// dialect.ValidateIdentifier. Default dialect.DefaultTable.
	Table string
	// Notifier is told after each successful Enqueue or ExecWithEvents,
	// besides the relays of this process (which are woken without it):
	// use it to reach relays in other processes, with pgnotify.Notifier.
	Notifier core.Notifier
	// Hooks run on every event before it is validated and written
	// (core.EnqueueHook).
	Hooks []core.EnqueueHook
	// Limits bound the events Enqueue accepts (core.Limits); an event
	// beyond them is refused before anything is written. Default
	// core.DefaultLimits.
	Limits core.Limits
	// SyncMark makes the relay's claims wait for the WAL flush of their
	// commit; see sqlxoutbox.Options.SyncMark, whose default (off) this
	// shares.
	SyncMark bool
	// SkipReadBack makes Enqueue leave the events' Seq and CreatedAt zero
	// instead of reading them back (RETURNING); see
	// sqlxoutbox.Options.SkipReadBack.
	SkipReadBack bool
	// Logger receives the adapter's warnings. Default slog.Default().
	Logger *slog.Logger
}

// Outbox is the outbox table of one PostgreSQL database reached through a
// pgx pool: the producers' Enqueue, the relay's core.Store, and the
// operators' tools. It is safe for concurrent use.
type Outbox struct {
	pool   *pgxpool.Pool
	q      *dialect.Queries
	opts   Options
	limits core.Limits
	// store runs the relay's claims and the operators' queries. Its claims
	// run on pgx's connections, borrowed from pool (package pgxbridge),
	// so they cost what this package's own code would.
	store *sqlxoutbox.Outbox
	// inLogMode: an insert found the table in log mode (logMode).
	inLogMode atomic.Bool
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

// New returns the Outbox of the table opts.Table in the database of pool.
// It does not connect; Ping checks the database and the table.
func New(pool *pgxpool.Pool, opts Options) (*Outbox, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pgxoutbox.New needs a *pgxpool.Pool", core.ErrInvalidOptions)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	limits, err := opts.Limits.WithDefaults()
	if err != nil {
		return nil, err
	}
	store, err := sqlxoutbox.NewDB(pgxbridge.DB(pool), sqlxoutbox.Options{
		Dialect: dialect.Postgres, Table: opts.Table, Notifier: opts.Notifier,
		Limits: limits, SyncMark: opts.SyncMark, Logger: opts.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("pgxoutbox: %w", err)
	}
	return &Outbox{pool: pool, q: store.Queries(), opts: opts, limits: limits, store: store}, nil
}

// Migrate creates or upgrades the txoutbox tables in the database of pool
// (dialect.Migrate with dialect.Postgres): the outbox, what ordered mode
// needs, and the inbox, as opts selects. It is safe to run from several
// processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts dialect.MigrateOptions) error {
	if pool == nil {
		return fmt.Errorf("%w: pgxoutbox.Migrate needs a *pgxpool.Pool", core.ErrInvalidOptions)
	}
	return dialect.Migrate(ctx, pgxbridge.DB(pool), dialect.Postgres, opts)
}

// Pool returns the pool the Outbox uses.
func (o *Outbox) Pool() *pgxpool.Pool { return o.pool }

// Queries returns the SQL the Outbox runs.
func (o *Outbox) Queries() *dialect.Queries { return o.q }

// checkTx refuses a nil transaction. The type pgx.Tx already keeps out a
// pool or a connection (they have no Commit), which would write an event
// outside the business transaction: the dual-write bug the outbox exists
// to remove.
func checkTx(tx pgx.Tx, call string) error {
	if tx == nil {
		return fmt.Errorf("%w: %s needs the caller's pgx.Tx, got nil", core.ErrNoTransaction, call)
	}
	return nil
}

// notify wakes the relays of this process and the Notifier.
func (o *Outbox) notify() {
	o.store.Wakeups().Notify()
	if o.opts.Notifier != nil {
		o.opts.Notifier.Notify()
	}
}

// Enqueue writes events in the caller's transaction tx (from pool.Begin,
// pgx.BeginFunc, or a savepoint from tx.Begin), so that they are published
// if and only if tx commits. It prepares every event (a UUIDv7 ID when none
// is set, the Hooks, validation against the Limits) before anything is
// written: an invalid event fails the call with an error wrapping
// core.ErrInvalidEvent that names the field and the limit, and tx stays
// usable for the caller's other writes. It then writes the events with one
// multi-row INSERT per dialect.MaxInsertRows events. A nil tx fails with
// core.ErrNoTransaction.
//
// The IDs, and the Seq and CreatedAt the database assigned (unless
// Options.SkipReadBack), are written back into events: pass a slice
// (Enqueue(ctx, tx, evs...)) to see them.
// Enqueue then wakes the relays of this process (and the Notifier), before
// tx commits.
func (o *Outbox) Enqueue(ctx context.Context, tx pgx.Tx, events ...core.Event) error {
	if err := checkTx(tx, "Enqueue"); err != nil {
		return err
	}
	if len(events) == 0 {
		return nil
	}
	if err := o.write(ctx, tx, events); err != nil {
		return err
	}
	o.notify()
	return nil
}

// write is Enqueue without the notification.
func (o *Outbox) write(ctx context.Context, tx pgx.Tx, events []core.Event) error {
	if err := dialect.Postgres.PrepareEvents(ctx, events, o.limits, o.opts.Hooks); err != nil {
		return err
	}
	for start := 0; start < len(events); start += dialect.MaxInsertRows {
		chunk := events[start:min(start+dialect.MaxInsertRows, len(events))]
		if err := o.insert(ctx, tx, chunk); err != nil {
			return err
		}
	}
	return nil
}

// logMode reports whether the table carries log mode's trigger
// (dialect.LogTrigger), which keeps inserted events out of the table. A
// positive answer is kept: a table leaves log mode by a teardown after
// which inserts return their rows again.
func (o *Outbox) logMode(ctx context.Context, tx pgx.Tx) (bool, error) {
	if o.inLogMode.Load() {
		return true, nil
	}
	var ok bool
	if err := tx.QueryRow(ctx, o.q.LogMode()).Scan(&ok); err != nil {
		return false, fmt.Errorf("pgxoutbox: insert returned no rows; look for log mode's trigger: %w", err)
	}
	o.inLogMode.Store(ok)
	return ok, nil
}

type inserted struct {
	seq     int64
	created time.Time
}

// checkInserted checks that an insert of want events wrote n rows. No rows
// can be log mode's trigger at work (the events went to the WAL, not the
// table): then it reports logMode.
func (o *Outbox) checkInserted(ctx context.Context, tx pgx.Tx, n, want int) (logMode bool, err error) {
	if n == 0 {
		if ok, err := o.logMode(ctx, tx); err != nil || ok {
			return ok, err
		}
	}
	if n != want {
		return false, fmt.Errorf("pgxoutbox: insert of %d events wrote %d rows", want, n)
	}
	return false, nil
}

func (o *Outbox) insert(ctx context.Context, tx pgx.Tx, events []core.Event) error {
	if o.opts.SkipReadBack {
		query, args, err := o.q.InsertNoReturning(events)
		if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, query, args...)
		if err != nil {
			return fmt.Errorf("pgxoutbox: insert %d events: %w", len(events), dialect.CheckMigrated(err, o.q.Table()))
		}
		_, err = o.checkInserted(ctx, tx, int(tag.RowsAffected()), len(events))
		return err
	}
	query, args, err := o.q.Insert(events)
	if err != nil {
		return err
	}
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("pgxoutbox: insert %d events: %w", len(events), dialect.CheckMigrated(err, o.q.Table()))
	}
	got := make([]inserted, 0, len(events))
	var r inserted
	_, err = pgx.ForEachRow(rows, []any{&r.seq, &r.created}, func() error {
		got = append(got, r)
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgxoutbox: insert %d events: %w", len(events), dialect.CheckMigrated(err, o.q.Table()))
	}
	if logMode, err := o.checkInserted(ctx, tx, len(got), len(events)); err != nil || logMode {
		return err
	}
	// Ids are assigned in VALUES order; RETURNING order is not promised.
	slices.SortFunc(got, func(a, b inserted) int { return cmp.Compare(a.seq, b.seq) })
	for i := range events {
		events[i].Seq = got[i].seq
		events[i].CreatedAt = got[i].created
		events[i].NextAttemptAt = got[i].created
	}
	return nil
}

// ExecWithEvents runs the caller's write statement sql (with args) in tx
// and writes events with it, in one statement and one round trip: the
// events' INSERT rides on the statement as a data-modifying WITH query
// (see dialect.Queries.InsertWith), so they are published if and only if
// tx commits, like Enqueue. For more than dialect.MaxInsertRows events it
// runs Enqueue and then the statement.
//
// sql must be a single INSERT, UPDATE, DELETE or SELECT, optionally with a
// WITH clause of its own, numbering its placeholders $1 to $len(args); the
// events' parameters are numbered after them. Anything else fails with an
// error wrapping dialect.ErrNotAttachable before anything is written. The
// command tag is the statement's own.
//
// The events' IDs are written back into events as by Enqueue; their Seq and
// CreatedAt are left zero on the one-statement path, which returns no rows
// of its own.
func (o *Outbox) ExecWithEvents(ctx context.Context, tx pgx.Tx, sql string, args []any, events ...core.Event) (pgconn.CommandTag, error) {
	if err := checkTx(tx, "ExecWithEvents"); err != nil {
		return pgconn.CommandTag{}, err
	}
	if len(events) == 0 {
		return tx.Exec(ctx, sql, args...)
	}
	var tag pgconn.CommandTag
	if len(events) > dialect.MaxInsertRows {
		if err := o.write(ctx, tx, events); err != nil {
			return tag, err
		}
		var err error
		if tag, err = tx.Exec(ctx, sql, args...); err != nil {
			return tag, err
		}
	} else {
		if err := dialect.Postgres.PrepareEvents(ctx, events, o.limits, o.opts.Hooks); err != nil {
			return tag, err
		}
		stmt, evArgs, err := o.q.InsertWith(sql, len(args), events)
		if err != nil {
			return tag, err
		}
		all := make([]any, 0, len(args)+len(evArgs))
		all = append(append(all, args...), evArgs...)
		if tag, err = tx.Exec(ctx, stmt, all...); err != nil {
			return tag, fmt.Errorf("pgxoutbox: statement with %d events: %w", len(events), dialect.CheckMigrated(err, o.q.Table()))
		}
	}
	o.notify()
	return tag, nil
}

// PendingTx returns the unpublished events of eventType (all types when it
// is "") as tx sees them, its own uncommitted ones included, in Seq order:
// for tests of a producer (see outboxtest.RequireEnqueued).
func (o *Outbox) PendingTx(ctx context.Context, tx pgx.Tx, eventType string) ([]core.Event, error) {
	if err := checkTx(tx, "PendingTx"); err != nil {
		return nil, err
	}
	query, args := o.q.Pending(eventType)
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("pgxoutbox: pending events: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	evs, err := sqlclaim.ScanPgx(rows, 0)
	if err != nil {
		return nil, fmt.Errorf("pgxoutbox: pending events: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	return evs, nil
}

// Claim implements core.Store, with the claims of sqlxoutbox.Outbox.Claim
// on PostgreSQL, run on connections borrowed from the pool.
func (o *Outbox) Claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	c, err := o.store.Claim(ctx, req)
	if err != nil {
		return nil, rename(err)
	}
	return claim{c}, nil
}

// claim names this package in the errors of the shared store's claim.
type claim struct{ core.Claim }

func (c claim) Commit(ctx context.Context, out core.Outcome) error {
	return rename(c.Claim.Commit(ctx, out))
}

func (c claim) Release(ctx context.Context) error { return rename(c.Claim.Release(ctx)) }

// Stats implements core.StatsReader: pending and dead counts, overall and per
// event type, and the age of the oldest pending event by the database's
// clock. It reads every unpublished row; call it every few seconds at most.
func (o *Outbox) Stats(ctx context.Context) (core.Stats, error) {
	s, err := o.store.Stats(ctx)
	return s, rename(err)
}

// DeletePublished implements core.Cleaner: it deletes at most limit events
// published before the given time, oldest first. Pending and dead events
// are never deleted.
func (o *Outbox) DeletePublished(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := o.store.DeletePublished(ctx, before, limit)
	return n, rename(err)
}

// Capabilities implements core.Store: ordered claims, of chosen partitions
// too; the pool's size bounds nothing here, so size it for the producers
// plus the relay's Concurrency.
func (o *Outbox) Capabilities() core.StoreCapabilities { return o.store.Capabilities() }

// Wakeups implements core.WakeupSource: the signal of the pool and table.
func (o *Outbox) Wakeups() *core.Signal { return o.store.Wakeups() }

// NextDue implements core.NextDueReader.
func (o *Outbox) NextDue(ctx context.Context) (time.Duration, bool, error) {
	d, ok, err := o.store.NextDue(ctx)
	return d, ok, rename(err)
}

// NewLeaser implements core.LeaserSource with the partition leaser of
// package ordered, with which relays of one table share the partitions.
func (o *Outbox) NewLeaser(lc core.LeaserConfig) (core.PartitionLeaser, error) {
	return o.store.NewLeaser(lc)
}

// Ping checks that the database answers and that the outbox table exists:
// an error wrapping core.ErrNotMigrated means the table is missing (run
// Migrate), any other that the database does not answer.
func (o *Outbox) Ping(ctx context.Context) error { return rename(o.store.Ping(ctx)) }

// CountPublishedBefore returns how many events were published before the
// given time: what a cleanup with that cut-off has to delete.
func (o *Outbox) CountPublishedBefore(ctx context.Context, before time.Time) (int64, error) {
	n, err := o.store.CountPublishedBefore(ctx, before)
	return n, rename(err)
}

// ListDead returns one page of the dead-lettered events matching f (an
// empty filter lists all), in Seq order, with their LastError and
// AttemptCount.
func (o *Outbox) ListDead(ctx context.Context, f DeadFilter, p Page) ([]core.Event, error) {
	evs, err := o.store.ListDead(ctx, f, p)
	return evs, rename(err)
}

// RetryDead re-queues the dead events matching f with a fresh budget of
// attempts, due now, and returns how many it re-queued. An empty filter
// without All is refused with dialect.ErrInvalidFilter.
func (o *Outbox) RetryDead(ctx context.Context, f DeadFilter) (int64, error) {
	n, err := o.store.RetryDead(ctx, f)
	return n, rename(err)
}

// PurgeDead deletes the dead events matching f and returns how many it
// deleted. An empty filter without All is refused with
// dialect.ErrInvalidFilter.
func (o *Outbox) PurgeDead(ctx context.Context, f DeadFilter) (int64, error) {
	n, err := o.store.PurgeDead(ctx, f)
	return n, rename(err)
}

// Replay makes the published events matching f pending again, so that the
// relay publishes them once more under their original IDs, and returns how
// many it re-queued. An empty filter without All is refused with
// dialect.ErrInvalidFilter.
func (o *Outbox) Replay(ctx context.Context, f ReplayFilter) (int64, error) {
	n, err := o.store.Replay(ctx, f)
	return n, rename(err)
}

// Get returns the event with the given ID, with its delivery bookkeeping,
// or an error wrapping core.ErrEventNotFound. It scans the table: it is for
// operators and tests.
func (o *Outbox) Get(ctx context.Context, eventID string) (core.Event, error) {
	ev, err := o.store.Get(ctx, eventID)
	return ev, rename(err)
}

// GetBySeq returns the event at the given Seq, or an error wrapping
// core.ErrEventNotFound.
func (o *Outbox) GetBySeq(ctx context.Context, seq int64) (core.Event, error) {
	ev, err := o.store.GetBySeq(ctx, seq)
	return ev, rename(err)
}

// rename gives an error of the shared store this package's name, keeping
// what it wraps, so that a pgx user's logs do not name an adapter they do
// not use.
func rename(err error) error {
	if err == nil {
		return nil
	}
	return &renamed{err}
}

type renamed struct{ err error }

func (r *renamed) Error() string {
	if rest, ok := strings.CutPrefix(r.err.Error(), "sqlxoutbox: "); ok {
		return "pgxoutbox: " + rest
	}
	return r.err.Error()
}

func (r *renamed) Unwrap() error { return r.err }

// DeadGroups returns the latest window dead events (0: all) grouped by
// event type and last error, the largest groups first, at most limit
// groups (default 500).
func (o *Outbox) DeadGroups(ctx context.Context, window, limit int) ([]DeadGroup, error) {
	gs, err := o.store.DeadGroups(ctx, window, limit)
	return gs, rename(err)
}

// ListEvents returns one page of the events matching f, newest first.
func (o *Outbox) ListEvents(ctx context.Context, f EventFilter, p EventPage) ([]core.Event, error) {
	evs, err := o.store.ListEvents(ctx, f, p)
	return evs, rename(err)
}

// CountPublishedSince returns how many events were published at or after
// since.
func (o *Outbox) CountPublishedSince(ctx context.Context, since time.Time) (int64, error) {
	n, err := o.store.CountPublishedSince(ctx, since)
	return n, rename(err)
}

// EstimateRows returns the table's row count as PostgreSQL estimates it,
// without reading the table.
func (o *Outbox) EstimateRows(ctx context.Context) (int64, bool, error) {
	n, est, err := o.store.EstimateRows(ctx)
	return n, est, rename(err)
}

// HeldAggregates returns the aggregates held back in ordered mode, in
// aggregate ID order, at most limit.
func (o *Outbox) HeldAggregates(ctx context.Context, limit int) ([]dialect.HeldAggregate, error) {
	hs, err := o.store.HeldAggregates(ctx, limit)
	return hs, rename(err)
}
