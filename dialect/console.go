package dialect

import (
	"fmt"
	"strings"
	"time"
)

// DeadGroup is the dead events of one event type that failed with one last
// error: what an operator retries or purges together.
type DeadGroup struct {
	EventType string
	LastError string
	Count     int64
	// FirstDead and LastDead bound the group's dead_at.
	FirstDead, LastDead time.Time
}

// DeadGroups returns the query of the latest window dead events (by
// dead_at; 0: all of them) grouped by event type and last error, the
// largest groups first, at most limit groups. It reads the dead rows only,
// newest first through their index, so a window bounds its cost however
// many dead letters there are. Columns: event_type, last_error (” for
// none), count, first and last dead_at.
func (q *Queries) DeadGroups(window, limit int) (string, []any) {
	if limit <= 0 {
		limit = 500
	}
	from := q.t + " WHERE dead_at IS NOT NULL"
	args := []any{}
	if window > 0 {
		from = "(SELECT event_type, last_error, dead_at FROM " + q.t + " WHERE dead_at IS NOT NULL ORDER BY dead_at DESC LIMIT ?) d"
		args = append(args, window)
	}
	args = append(args, limit)
	return q.d.rebind("SELECT event_type, COALESCE(last_error, ''), COUNT(*), MIN(dead_at), MAX(dead_at) FROM " + from +
		" GROUP BY event_type, COALESCE(last_error, '') ORDER BY COUNT(*) DESC, event_type LIMIT ?"), args
}

// Event states an EventFilter selects.
const (
	StatePending   = "pending"
	StatePublished = "published"
	StateDead      = "dead"
)

// EventFilter selects events to list. Set fields are combined with AND.
type EventFilter struct {
	// EventType, AggregateType and AggregateID select exact values.
	EventType     string
	AggregateType string
	AggregateID   string
	// State is StatePending, StatePublished, StateDead or "" (all).
	State string
	// CreatedFrom (inclusive) and CreatedTo (exclusive) bound CreatedAt.
	CreatedFrom, CreatedTo time.Time
}

// EventPage is a page of a listing newest first: events with Seq below
// BeforeSeq (0: from the newest), at most Limit of them (default 50).
type EventPage struct {
	BeforeSeq int64
	Limit     int
}

// ListEvents returns the query of one page of the events matching f,
// newest first (Seq descending), for operators. It walks the primary key
// backwards from p.BeforeSeq and stops at the page's end, so a page of a
// common filter costs a page of rows whatever the table holds; a filter
// that matches rarely reads further.
func (q *Queries) ListEvents(f EventFilter, p EventPage) (string, []any, error) {
	w := []string{"1 = 1"}
	var args []any
	add := func(cond string, arg any) {
		w = append(w, cond)
		args = append(args, arg)
	}
	if f.EventType != "" {
		add("event_type = ?", f.EventType)
	}
	if f.AggregateType != "" {
		add("aggregate_type = ?", f.AggregateType)
	}
	if f.AggregateID != "" {
		add("aggregate_id = ?", f.AggregateID)
	}
	switch f.State {
	case "":
	case StatePending:
		w = append(w, "published_at IS NULL AND dead_at IS NULL")
	case StatePublished:
		w = append(w, "published_at IS NOT NULL")
	case StateDead:
		w = append(w, "dead_at IS NOT NULL")
	default:
		return "", nil, errInvalidState(f.State)
	}
	if !f.CreatedFrom.IsZero() {
		add("created_at >= ?", q.d.TimeArg(f.CreatedFrom))
	}
	if !f.CreatedTo.IsZero() {
		add("created_at < ?", q.d.TimeArg(f.CreatedTo))
	}
	if p.BeforeSeq > 0 {
		add("id < ?", p.BeforeSeq)
	}
	if p.Limit <= 0 {
		p.Limit = 50
	}
	args = append(args, p.Limit)
	return q.d.rebind("SELECT " + q.cols + " FROM " + q.t + " WHERE " + strings.Join(w, " AND ") + " ORDER BY id DESC LIMIT ?"), args, nil
}

// CountPublishedSince returns the query of how many events were published
// at or after the given time: a range of the published_at index, cheap for
// a recent time.
func (q *Queries) CountPublishedSince(since time.Time) (string, []any) {
	return q.d.rebind("SELECT COUNT(*) FROM " + q.t + " WHERE published_at >= ?"), []any{q.d.TimeArg(since)}
}

// EstimateRows returns the query of the table's row count as the database
// estimates it (PostgreSQL's reltuples, MySQL's TABLE_ROWS), without
// reading the table, and whether the figure is an estimate: SQLite keeps
// none, so there it is an exact COUNT(*).
func (q *Queries) EstimateRows() (string, []any, bool) {
	switch q.d.kind {
	case kindPostgres:
		return "SELECT CAST(GREATEST(reltuples, 0) AS bigint) FROM pg_class WHERE oid = to_regclass($1)", []any{q.t}, true
	case kindMySQL:
		schema := "DATABASE()"
		args := []any{q.id.Name}
		if q.id.Schema != "" {
			schema = "?"
			args = []any{q.id.Schema, q.id.Name}
		}
		return "SELECT COALESCE(TABLE_ROWS, 0) FROM information_schema.TABLES WHERE TABLE_SCHEMA = " + schema + " AND TABLE_NAME = ?", args, true
	}
	return "SELECT COUNT(*) FROM " + q.t, nil, false
}

func errInvalidState(s string) error {
	return fmt.Errorf("%w: event state %q (want pending, published or dead)", ErrInvalidFilter, s)
}

// HeldAggregate is an aggregate whose earliest unpublished event failed:
// in ordered mode its later events wait behind it.
type HeldAggregate struct {
	AggregateID string
	// Failing counts its unpublished events that failed at least once.
	Failing int64
	// FirstSeq is the earliest of them: the one the others wait for.
	FirstSeq int64
	// Attempts is the most attempts among them.
	Attempts int
	// Dead: one of them is dead-lettered (it blocks the aggregate under
	// the block policy until re-queued or purged).
	Dead bool
	// NextAttempt is the earliest next attempt among those not dead.
	NextAttempt time.Time
	// LastError is the last error of the earliest one.
	LastError string
}

// HeldAggregates returns the query of the aggregates held back in ordered
// mode (an unpublished event of theirs failed at least once), in aggregate
// ID order, at most limit. It reads ordered mode's index of failed events
// in its own order, at most 50 events an aggregate on average, so its cost
// does not grow with the failed events. Columns: aggregate_id, count (of
// those read), min id, max attempt_count, dead (0/1), earliest
// next_attempt_at of the live ones, and the last error of the earliest.
func (q *Queries) HeldAggregates(limit int) (string, []any) {
	if limit <= 0 {
		limit = 200
	}
	return q.d.rebind("SELECT h.aggregate_id, h.n, h.first, h.attempts, h.dead, h.next_at, COALESCE(o.last_error, '') FROM (" +
		"SELECT aggregate_id, COUNT(*) AS n, MIN(id) AS first, MAX(attempt_count) AS attempts," +
		" MAX(CASE WHEN dead_at IS NOT NULL THEN 1 ELSE 0 END) AS dead," +
		" MIN(CASE WHEN dead_at IS NULL THEN next_attempt_at END) AS next_at" +
		" FROM (SELECT aggregate_id, id, attempt_count, dead_at, next_attempt_at FROM " + q.t +
		" WHERE published_at IS NULL AND attempt_count > 0 AND aggregate_id <> '' ORDER BY aggregate_id, id LIMIT ?) f" +
		" GROUP BY aggregate_id ORDER BY aggregate_id LIMIT ?) h JOIN " + q.t + " o ON o.id = h.first ORDER BY h.aggregate_id"), []any{limit * 50, limit}
}

// Consumers returns the query of the inbox's consumers, each once. On
// PostgreSQL it skips through the primary key (consumer, event_id) rather
// than reading every record.
func (q *InboxQueries) Consumers() string {
	t := q.d.qualified(q.id)
	if q.d.kind == kindPostgres {
		return "WITH RECURSIVE c AS (SELECT MIN(consumer) AS consumer FROM " + t +
			" UNION ALL SELECT (SELECT MIN(consumer) FROM " + t + " WHERE consumer > c.consumer) FROM c WHERE c.consumer IS NOT NULL)" +
			" SELECT consumer FROM c WHERE consumer IS NOT NULL"
	}
	return "SELECT DISTINCT consumer FROM " + t + " ORDER BY consumer"
}

// ConsumerStats returns the query of how many records a consumer has and
// when it processed its latest: a range of the primary key.
func (q *InboxQueries) ConsumerStats(consumer string) (string, []any) {
	return q.d.rebind("SELECT COUNT(*), MAX(processed_at) FROM " + q.d.qualified(q.id) + " WHERE consumer = ?"), []any{consumer}
}

// ProcessedAt returns the query of when consumer processed eventID (no row
// if it did not).
func (q *InboxQueries) ProcessedAt(consumer, eventID string) (string, []any) {
	return q.d.rebind("SELECT processed_at FROM " + q.d.qualified(q.id) + " WHERE consumer = ? AND event_id = ?"), []any{consumer, eventID}
}
