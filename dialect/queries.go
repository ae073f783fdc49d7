package dialect

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/txoutbox/core"
)

// ErrInvalidFilter is wrapped by errors that reject a filter of a dead-letter
// or replay operation, e.g. an empty one that would touch every row without
// All set.
var ErrInvalidFilter = errors.New("dialect: invalid filter")

// MaxInsertRows is the most events one Insert statement writes. Callers split
// bigger batches; it keeps every statement far below the bind parameter
// limits (65535 on PostgreSQL, 32766 on SQLite) at 6 parameters per row.
const MaxInsertRows = 1000

// eventColumns is the column list every event-returning statement selects,
// in the order scanEvent reads them.
const eventColumns = "id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, published_at, attempt_count, last_error, next_attempt_at, dead_at"

// Queries is the outbox SQL of one dialect for one table. It is immutable
// and safe for concurrent use; build it once with Dialect.Queries.
type Queries struct {
	d     Dialect
	id    Identifier
	t     string // quoted, qualified table
	cols  string
	claim string
	// claimMarked and claimMarkedAsync: see ClaimMarked (PostgreSQL).
	claimMarked, claimMarkedAsync string
	stats                         string
	nextDue                       string
	del                           string
	get                           string
	seq                           string
	insertOne                     string // Insert of one event, the common case
	insertOnePlain                string // InsertNoReturning of one event
}

// Queries returns the statements for the outbox table named table (""
// selects DefaultTable). It fails with an error wrapping
// ErrInvalidIdentifier for a name ValidateIdentifier rejects.
func (d Dialect) Queries(table string) (*Queries, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	if table == "" {
		table = DefaultTable
	}
	id, err := ValidateIdentifier(table)
	if err != nil {
		return nil, err
	}
	// No casts to text in the column list: pgx and lib/pq both hand uuid
	// and jsonb to database/sql as text or bytes, which ScanEvent takes, and
	// the binary protocol then spares the server uuid_out on every row.
	q := &Queries{d: d, id: id, t: d.qualified(id), cols: eventColumns}
	now := d.now()
	due := "published_at IS NULL AND dead_at IS NULL AND next_attempt_at <= " + now
	// A scheduled event is one never attempted whose time is ahead; one
	// in backoff is lag. An unattempted event fell due at its first
	// next_attempt_at (its created_at unless scheduled), a retried one
	// when it was written.
	scheduled := "(attempt_count = 0 AND next_attempt_at > " + now + ")"
	fellDue := "CASE WHEN attempt_count = 0 THEN next_attempt_at ELSE created_at END"
	switch d.kind {
	case kindPostgres:
		q.claim = "SELECT " + q.cols + " FROM " + q.t + " WHERE " + due +
			" ORDER BY next_attempt_at, id LIMIT ? FOR UPDATE SKIP LOCKED"
		q.buildClaimMarked(due)
		// Two aggregates, each through its own partial index (the pending
		// rows' and the dead rows' by type, an index-only scan): one
		// query with an OR of both predicates made the planner read the
		// whole table once the dead rows were a few percent of it (550 ms
		// instead of 15 ms with 5M published and 100k dead rows kept).
		q.stats = "SELECT event_type, CAST(SUM(p) AS bigint), CAST(SUM(d) AS bigint), MIN(oldest)," +
			" CAST(EXTRACT(EPOCH FROM " + now + " - MIN(oldest)) AS double precision), CAST(SUM(s) AS bigint) FROM (" +
			"SELECT event_type, COUNT(*) FILTER (WHERE NOT " + scheduled + ") AS p, 0 AS d," +
			" MIN(" + fellDue + ") FILTER (WHERE NOT " + scheduled + ") AS oldest," +
			" COUNT(*) FILTER (WHERE " + scheduled + ") AS s FROM " + q.t +
			" WHERE published_at IS NULL AND dead_at IS NULL GROUP BY event_type" +
			" UNION ALL SELECT event_type, 0, COUNT(*), NULL, 0 FROM " + q.t + " WHERE dead_at IS NOT NULL GROUP BY event_type" +
			") s GROUP BY event_type"
		q.get = "SELECT " + q.cols + " FROM " + q.t + " WHERE event_id = CAST(? AS uuid) ORDER BY id LIMIT 1"
	case kindSQLite:
		// The lease is the claim: one short write, no transaction held
		// while the batch is published.
		q.claim = "UPDATE " + q.t + " SET claimed_until = strftime('%Y-%m-%dT%H:%M:%fZ','now',?)" +
			" WHERE id IN (SELECT id FROM " + q.t + " WHERE " + due +
			" AND (claimed_until IS NULL OR claimed_until <= " + now + ")" +
			" ORDER BY next_attempt_at, id LIMIT ?) RETURNING " + q.cols
		q.stats = "SELECT event_type," +
			" SUM(CASE WHEN dead_at IS NULL AND NOT " + scheduled + " THEN 1 ELSE 0 END)," +
			" SUM(CASE WHEN dead_at IS NOT NULL THEN 1 ELSE 0 END)," +
			" MIN(CASE WHEN dead_at IS NULL AND NOT " + scheduled + " THEN " + fellDue + " END)," +
			" (julianday('now') - julianday(MIN(CASE WHEN dead_at IS NULL AND NOT " + scheduled + " THEN " + fellDue + " END))) * 86400.0," +
			" SUM(CASE WHEN dead_at IS NULL AND " + scheduled + " THEN 1 ELSE 0 END)" +
			" FROM " + q.t + " WHERE published_at IS NULL GROUP BY event_type"
		q.get = "SELECT " + q.cols + " FROM " + q.t + " WHERE event_id = ? ORDER BY id LIMIT 1"
	case kindMySQL:
		// Run under ClaimTxOptions (READ COMMITTED): see there.
		q.claim = "SELECT " + q.cols + " FROM " + q.t + " WHERE " + due +
			" ORDER BY next_attempt_at, id LIMIT ? FOR UPDATE SKIP LOCKED"
		q.stats = "SELECT event_type," +
			" SUM(CASE WHEN dead_at IS NULL AND NOT " + scheduled + " THEN 1 ELSE 0 END)," +
			" SUM(CASE WHEN dead_at IS NOT NULL THEN 1 ELSE 0 END)," +
			" MIN(CASE WHEN dead_at IS NULL AND NOT " + scheduled + " THEN " + fellDue + " END)," +
			" TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN dead_at IS NULL AND NOT " + scheduled + " THEN " + fellDue + " END), " + now + ") / 1000000.0," +
			" SUM(CASE WHEN dead_at IS NULL AND " + scheduled + " THEN 1 ELSE 0 END)" +
			" FROM " + q.t + " WHERE published_at IS NULL GROUP BY event_type"
		q.get = "SELECT " + q.cols + " FROM " + q.t + " WHERE event_id = ? ORDER BY id LIMIT 1"
	}
	ahead := " FROM " + q.t + " WHERE published_at IS NULL AND dead_at IS NULL AND next_attempt_at > " + now
	switch d.kind {
	case kindPostgres:
		q.nextDue = "SELECT CAST(EXTRACT(EPOCH FROM MIN(next_attempt_at) - " + now + ") AS double precision)" + ahead
	case kindSQLite:
		q.nextDue = "SELECT (julianday(MIN(next_attempt_at)) - julianday('now')) * 86400.0" + ahead
	case kindMySQL:
		q.nextDue = "SELECT TIMESTAMPDIFF(MICROSECOND, " + now + ", MIN(next_attempt_at)) / 1000000.0" + ahead
	}
	q.claim = d.rebind(q.claim)
	q.stats = d.rebind(q.stats)
	q.get = d.rebind(q.get)
	if d.kind == kindMySQL {
		// MySQL takes no LIMIT in an IN subquery, nor a subquery on the
		// table a DELETE deletes from; its DELETE has ORDER BY and LIMIT.
		q.del = "DELETE FROM " + q.t + " WHERE published_at < ? ORDER BY published_at LIMIT ?"
	} else {
		q.del = d.rebind("DELETE FROM " + q.t + " WHERE id IN (SELECT id FROM " + q.t +
			" WHERE published_at < ? ORDER BY published_at LIMIT ?)")
	}
	q.seq = d.rebind("SELECT " + q.cols + " FROM " + q.t + " WHERE id = ?")
	one, _, err := q.Insert([]core.Event{{}})
	if err != nil {
		return nil, err
	}
	q.insertOne = one
	if one, _, err = q.InsertNoReturning([]core.Event{{}}); err != nil {
		return nil, err
	}
	q.insertOnePlain = one
	return q, nil
}

// Dialect returns the dialect q was built for.
func (q *Queries) Dialect() Dialect { return q.d }

// Probe returns a query that reads nothing and fails when the table does
// not exist (see CheckMigrated).
func (q *Queries) Probe() string { return "SELECT 1 FROM " + q.t + " WHERE 1 = 0" }

// Table returns the validated table name q runs against.
func (q *Queries) Table() Identifier { return q.id }

// Stats returns the query whose rows CollectStats reads: per event type the
// pending and dead counts, when the oldest pending event fell due and its
// age by the database's clock, and the count of scheduled events. It reads every unpublished row, so run it every few
// seconds, not per event.
func (q *Queries) Stats() string { return q.stats }

// NextDue returns the query (no arguments) of how many seconds, by the
// database's clock, until the earliest unpublished, not dead event that is
// not due yet falls due; NULL when there is none. It reads the first entry
// of the claim index past now.
func (q *Queries) NextDue() string { return q.nextDue }

// DeletePublished returns the DELETE of at most limit events published
// before the given time, oldest first. Pending and dead events have no
// published_at and are never selected.
func (q *Queries) DeletePublished(before time.Time, limit int) (string, []any) {
	return q.del, []any{q.d.TimeArg(before), limit}
}

// Pending returns the query of the unpublished events of eventType (every
// type for ""), in Seq order.
func (q *Queries) Pending(eventType string) (string, []any) {
	if eventType == "" {
		return q.d.rebind("SELECT " + q.cols + " FROM " + q.t + " WHERE published_at IS NULL ORDER BY id"), nil
	}
	return q.d.rebind("SELECT " + q.cols + " FROM " + q.t + " WHERE published_at IS NULL AND event_type = ? ORDER BY id"), []any{eventType}
}

// CountPublishedBefore returns the query of how many events were published
// before the given time: what DeletePublished has left to delete.
func (q *Queries) CountPublishedBefore(before time.Time) (string, []any) {
	return q.d.rebind("SELECT count(*) FROM " + q.t + " WHERE published_at < ?"), []any{q.d.TimeArg(before)}
}

// GetByEventID returns the query for the event with the given ID (the first
// written, should a producer have reused one). There is deliberately no
// index on event_id (see the migrations), so it scans the table: it is for
// operators, not for hot paths.
func (q *Queries) GetByEventID(eventID string) (string, []any, error) {
	if _, err := uuid.Parse(eventID); err != nil {
		return "", nil, fmt.Errorf("%w: event ID %q is not a UUID", ErrInvalidFilter, eventID)
	}
	return q.get, []any{eventID}, nil
}

// GetBySeq returns the query for the event at seq (the primary key).
func (q *Queries) GetBySeq(seq int64) (string, []any) { return q.seq, []any{seq} }

// seqMatch is the condition "id is one of the list passed as seqArg", on
// PostgreSQL and SQLite. On PostgreSQL it is = ANY of an array that travels
// as text, which any driver can bind, and which the planner turns into one
// index scan. MySQL has no such condition that MariaDB answers by primary
// key: with IN (SELECT … FROM JSON_TABLE) it reads the key from its start
// and locks every row it passes, so its statements join the list
// (mysqlJoinSeqs) or spell it out.
func (q *Queries) seqMatch() string {
	if q.d.kind == kindPostgres {
		return "= ANY(CAST(CAST(? AS text) AS bigint[]))"
	}
	return "IN " + q.seqSet()
}

func (q *Queries) seqSet() string { return "(SELECT value FROM json_each(?))" }

func (q *Queries) seqArg(seqs []int64) string {
	open, close := "[", "]"
	if q.d.kind == kindPostgres {
		open, close = "{", "}"
	}
	b := make([]byte, 0, 2+len(seqs)*8)
	b = append(b, open...)
	for i, s := range seqs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, s, 10)
	}
	return string(append(b, close...))
}

func (q *Queries) eventIDMatch(ids []string) (string, any, error) {
	for _, id := range ids {
		if _, err := uuid.Parse(id); err != nil {
			return "", nil, fmt.Errorf("%w: event ID %q is not a UUID", ErrInvalidFilter, id)
		}
	}
	js, err := json.Marshal(ids)
	if err != nil {
		return "", nil, fmt.Errorf("dialect: encode event IDs: %w", err)
	}
	switch q.d.kind {
	case kindPostgres:
		return "event_id IN (SELECT CAST(value AS uuid) FROM jsonb_array_elements_text(CAST(? AS jsonb)))", string(js), nil
	case kindMySQL:
		return "event_id IN (SELECT event_id FROM JSON_TABLE(?, '$[*]' COLUMNS (event_id CHAR(36) CHARACTER SET ascii PATH '$')) AS j)", string(js), nil
	}
	return "event_id IN (SELECT value FROM json_each(?))", string(js), nil
}

// sqliteModifier is a strftime modifier adding d to a time.
func sqliteModifier(d time.Duration) string {
	return fmt.Sprintf("%+.3f seconds", d.Seconds())
}

// LogTrigger is the BEFORE INSERT trigger of log mode (package logrelay):
// it sends each event inserted into the outbox table to the write-ahead log
// as a logical decoding message and keeps the row out of the table, so an
// insert of events returns no rows.
const LogTrigger = "txoutbox_log"

// LogMode returns, on PostgreSQL, the query (no arguments, one boolean)
// that tells whether the table carries LogTrigger, enabled. Stores ask it
// when an insert of events returned no rows, to tell log mode from a fault.
func (q *Queries) LogMode() string {
	return "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass('" + q.t +
		"') AND tgname = '" + LogTrigger + "' AND tgenabled <> 'D')"
}
