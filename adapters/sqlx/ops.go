package sqlxoutbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// Stats implements core.StatsReader: pending and dead counts, overall and
// per event type, and the age of the oldest pending event by the database's
// clock. It reads every unpublished row; call it every few seconds at most.
// It also looks at the *sql.DB's pool: when the pool closed more than a few
// connections per second since the previous call for want of an idle slot
// (database/sql keeps two idle by default, so four producers and a relay
// open a server connection per transaction), it logs once how to fix it
// (SetMaxIdleConns).
func (o *Outbox) Stats(ctx context.Context) (core.Stats, error) {
	o.pool.Check(o.db, o.opts.Logger)
	rows, err := o.db.QueryContext(ctx, o.q.Stats())
	if err != nil {
		return core.Stats{}, fmt.Errorf("sqlxoutbox: stats: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	s, err := dialect.CollectStats(rows)
	if err != nil {
		return core.Stats{}, fmt.Errorf("sqlxoutbox: stats: %w", err)
	}
	return s, nil
}

// NextDue implements core.NextDueReader: how long, by the database's clock,
// until the next event that is not due yet falls due.
func (o *Outbox) NextDue(ctx context.Context) (time.Duration, bool, error) {
	var secs sql.NullFloat64
	if err := o.db.QueryRowContext(ctx, o.q.NextDue()).Scan(&secs); err != nil {
		return 0, false, fmt.Errorf("sqlxoutbox: next due event: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	if !secs.Valid {
		return 0, false, nil
	}
	return time.Duration(max(secs.Float64, 0) * float64(time.Second)), true, nil
}

// DeletePublished implements core.Cleaner: it deletes at most limit events
// published before the given time, oldest first. Pending and dead events are
// never deleted. On SQLite, before is truncated to milliseconds.
func (o *Outbox) DeletePublished(ctx context.Context, before time.Time, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("%w: delete limit %d", core.ErrInvalidOptions, limit)
	}
	query, args := o.q.DeletePublished(before, limit)
	return o.exec(ctx, "delete published events", query, args)
}

// CountPublishedBefore returns how many events were published before the
// given time: what a cleanup with that cut-off has to delete.
func (o *Outbox) CountPublishedBefore(ctx context.Context, before time.Time) (int64, error) {
	query, args := o.q.CountPublishedBefore(before)
	var n int64
	if err := o.db.QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("sqlxoutbox: count published events: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	return n, nil
}

// ListDead returns one page of the dead-lettered events matching f (an empty
// filter lists all), in Seq order, with their LastError and AttemptCount.
func (o *Outbox) ListDead(ctx context.Context, f DeadFilter, p Page) ([]core.Event, error) {
	query, args, err := o.q.ListDead(f, p)
	if err != nil {
		return nil, err
	}
	rows, err := o.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlxoutbox: list dead events: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	evs, err := dialect.CollectEvents(rows)
	if err != nil {
		return nil, fmt.Errorf("sqlxoutbox: list dead events: %w", err)
	}
	return evs, nil
}

// RetryDead re-queues the dead events matching f (by Seqs, EventIDs,
// EventType, DeadBefore, or All) with a fresh budget of attempts, due now,
// and returns how many it re-queued. An empty filter without All is refused
// with dialect.ErrInvalidFilter.
func (o *Outbox) RetryDead(ctx context.Context, f DeadFilter) (int64, error) {
	query, args, err := o.q.RetryDead(f)
	if err != nil {
		return 0, err
	}
	return o.execWake(ctx, "retry dead events", query, args)
}

// PurgeDead deletes the dead events matching f and returns how many it
// deleted. An empty filter without All is refused with
// dialect.ErrInvalidFilter.
func (o *Outbox) PurgeDead(ctx context.Context, f DeadFilter) (int64, error) {
	query, args, err := o.q.PurgeDead(f)
	if err != nil {
		return 0, err
	}
	return o.exec(ctx, "purge dead events", query, args)
}

// Replay makes the published events matching f pending again, so that the
// relay publishes them once more under their original IDs, and returns how
// many it re-queued. Only events still in the table (not yet removed by
// cleanup) can be replayed. An empty filter without All is refused with
// dialect.ErrInvalidFilter.
func (o *Outbox) Replay(ctx context.Context, f ReplayFilter) (int64, error) {
	query, args, err := o.q.Replay(f)
	if err != nil {
		return 0, err
	}
	return o.execWake(ctx, "replay events", query, args)
}

// Get returns the event with the given ID, with its delivery bookkeeping, or
// an error wrapping core.ErrEventNotFound. event_id has no index (see the migrations),
// so Get scans the table: it is for operators and tests.
func (o *Outbox) Get(ctx context.Context, eventID string) (core.Event, error) {
	query, args, err := o.q.GetByEventID(eventID)
	if err != nil {
		return core.Event{}, err
	}
	return o.getOne(ctx, query, args, "event "+eventID)
}

// GetBySeq returns the event at the given Seq, or an error wrapping
// core.ErrEventNotFound.
func (o *Outbox) GetBySeq(ctx context.Context, seq int64) (core.Event, error) {
	query, args := o.q.GetBySeq(seq)
	return o.getOne(ctx, query, args, fmt.Sprintf("event at seq %d", seq))
}

func (o *Outbox) getOne(ctx context.Context, query string, args []any, what string) (core.Event, error) {
	ev, err := dialect.ScanEvent(o.db.QueryRowContext(ctx, query, args...).Scan)
	if errors.Is(err, sql.ErrNoRows) {
		return core.Event{}, fmt.Errorf("%w: %s", core.ErrEventNotFound, what)
	}
	if err != nil {
		return core.Event{}, fmt.Errorf("sqlxoutbox: get %s: %w", what, dialect.CheckMigrated(err, o.q.Table()))
	}
	return ev, nil
}

func (o *Outbox) exec(ctx context.Context, what, query string, args []any) (int64, error) {
	res, err := o.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, fmt.Errorf("sqlxoutbox: %s: %w", what, dialect.CheckMigrated(err, o.q.Table()))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("sqlxoutbox: %s: %w", what, err)
	}
	return n, nil
}

// execWake is exec for a statement that makes events due: it wakes the
// relays of this process when it changed a row.
func (o *Outbox) execWake(ctx context.Context, what, query string, args []any) (int64, error) {
	n, err := o.exec(ctx, what, query, args)
	if n > 0 {
		o.notify()
	}
	return n, err
}

// Ping checks that the database answers and that the outbox table exists:
// an error wrapping core.ErrNotMigrated means the table is missing (run the
// migrations), any other that the database does not answer.
func (o *Outbox) Ping(ctx context.Context) error {
	rows, err := o.db.QueryContext(ctx, o.q.Probe())
	if err == nil {
		err = errors.Join(rows.Err(), rows.Close())
	}
	if err != nil {
		return fmt.Errorf("sqlxoutbox: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	return nil
}

// PendingTx returns the unpublished events of eventType (all types when it
// is "") as tx sees them, its own uncommitted ones included, in Seq order:
// for tests of a producer (see outboxtest.RequireEnqueued).
func (o *Outbox) PendingTx(ctx context.Context, tx Tx, eventType string) ([]core.Event, error) {
	if err := checkTx(tx, "PendingTx"); err != nil {
		return nil, err
	}
	query, args := o.q.Pending(eventType)
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlxoutbox: pending events: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	evs, err := dialect.CollectEvents(rows)
	if err != nil {
		return nil, fmt.Errorf("sqlxoutbox: pending events: %w", err)
	}
	return evs, nil
}

// DeadGroups returns the latest window dead events (0: all) grouped by
// event type and last error, the largest groups first, at most limit
// groups (default 500): what the console shows an operator.
func (o *Outbox) DeadGroups(ctx context.Context, window, limit int) ([]DeadGroup, error) {
	query, args := o.q.DeadGroups(window, limit)
	rows, err := o.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlxoutbox: group dead events: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	defer rows.Close()
	var out []DeadGroup
	for rows.Next() {
		var g DeadGroup
		var first, last dialect.Time
		if err := rows.Scan(&g.EventType, &g.LastError, &g.Count, &first, &last); err != nil {
			return nil, fmt.Errorf("sqlxoutbox: group dead events: %w", err)
		}
		g.FirstDead, g.LastDead = first.Time, last.Time
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlxoutbox: group dead events: %w", err)
	}
	return out, nil
}

// ListEvents returns one page of the events matching f, newest first (see
// dialect.Queries.ListEvents), with their bookkeeping.
func (o *Outbox) ListEvents(ctx context.Context, f EventFilter, p EventPage) ([]core.Event, error) {
	query, args, err := o.q.ListEvents(f, p)
	if err != nil {
		return nil, err
	}
	rows, err := o.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlxoutbox: list events: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	evs, err := dialect.CollectEvents(rows)
	if err != nil {
		return nil, fmt.Errorf("sqlxoutbox: list events: %w", err)
	}
	return evs, nil
}

// CountPublishedSince returns how many events were published at or after
// since.
func (o *Outbox) CountPublishedSince(ctx context.Context, since time.Time) (int64, error) {
	query, args := o.q.CountPublishedSince(since)
	var n int64
	if err := o.db.QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("sqlxoutbox: count published events: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	return n, nil
}

// EstimateRows returns the table's row count as the database estimates it
// without reading the table, and whether it is an estimate (SQLite keeps
// none: there it is an exact count).
func (o *Outbox) EstimateRows(ctx context.Context) (n int64, estimate bool, err error) {
	query, args, estimate := o.q.EstimateRows()
	if err := o.db.QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
		return 0, estimate, fmt.Errorf("sqlxoutbox: estimate rows: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	return n, estimate, nil
}

// HeldAggregate is an aggregate held back in ordered mode; see
// dialect.HeldAggregate.
type HeldAggregate = dialect.HeldAggregate

// HeldAggregates returns the aggregates held back in ordered mode (an
// unpublished event of theirs failed), in aggregate ID order, at most
// limit.
func (o *Outbox) HeldAggregates(ctx context.Context, limit int) ([]HeldAggregate, error) {
	query, args := o.q.HeldAggregates(limit)
	rows, err := o.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlxoutbox: held aggregates: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	defer rows.Close()
	var out []HeldAggregate
	for rows.Next() {
		var h HeldAggregate
		var dead int
		var next dialect.Time
		if err := rows.Scan(&h.AggregateID, &h.Failing, &h.FirstSeq, &h.Attempts, &dead, &next, &h.LastError); err != nil {
			return nil, fmt.Errorf("sqlxoutbox: held aggregates: %w", err)
		}
		h.Dead, h.NextAttempt = dead == 1, next.Time
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlxoutbox: held aggregates: %w", err)
	}
	return out, nil
}
