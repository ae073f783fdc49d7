package dialect

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
			" CAST(EXTRACT(EPOCH FROM " + now + " - MIN(oldest)) AS double precision) FROM (" +
			"SELECT event_type, COUNT(*) AS p, 0 AS d, MIN(created_at) AS oldest FROM " + q.t +
			" WHERE published_at IS NULL AND dead_at IS NULL GROUP BY event_type" +
			" UNION ALL SELECT event_type, 0, COUNT(*), NULL FROM " + q.t + " WHERE dead_at IS NOT NULL GROUP BY event_type" +
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
			" SUM(CASE WHEN dead_at IS NULL THEN 1 ELSE 0 END)," +
			" SUM(CASE WHEN dead_at IS NOT NULL THEN 1 ELSE 0 END)," +
			" MIN(CASE WHEN dead_at IS NULL THEN created_at END)," +
			" (julianday('now') - julianday(MIN(CASE WHEN dead_at IS NULL THEN created_at END))) * 86400.0" +
			" FROM " + q.t + " WHERE published_at IS NULL GROUP BY event_type"
		q.get = "SELECT " + q.cols + " FROM " + q.t + " WHERE event_id = ? ORDER BY id LIMIT 1"
	case kindMySQL:
		// Run under ClaimTxOptions (READ COMMITTED): see there.
		q.claim = "SELECT " + q.cols + " FROM " + q.t + " WHERE " + due +
			" ORDER BY next_attempt_at, id LIMIT ? FOR UPDATE SKIP LOCKED"
		q.stats = "SELECT event_type," +
			" SUM(CASE WHEN dead_at IS NULL THEN 1 ELSE 0 END)," +
			" SUM(CASE WHEN dead_at IS NOT NULL THEN 1 ELSE 0 END)," +
			" MIN(CASE WHEN dead_at IS NULL THEN created_at END)," +
			" TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN dead_at IS NULL THEN created_at END), " + now + ") / 1000000.0" +
			" FROM " + q.t + " WHERE published_at IS NULL GROUP BY event_type"
		q.get = "SELECT " + q.cols + " FROM " + q.t + " WHERE event_id = ? ORDER BY id LIMIT 1"
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

// Insert returns one multi-row INSERT of events (at most MaxInsertRows, each
// already Prepared) that returns "id, created_at" of every row. The rows may
// come back in any order; ids grow in the order of events, so sort the
// returned rows by id to pair them with events.
//
// On MySQL, which has no RETURNING (Dialect.ReturnsInserted), the statement
// returns no rows: read them back in the same transaction with
// InsertedRows.
func (q *Queries) Insert(events []core.Event) (string, []any, error) {
	suffix := ""
	if q.d.ReturnsInserted() {
		suffix = " RETURNING id, created_at"
	}
	return q.insert(events, q.insertOne, suffix)
}

// InsertNoReturning is Insert without "RETURNING id, created_at": for a
// writer that does not read the rows' id and created_at back
// (sqlxoutbox.Options.SkipReadBack). On MySQL it is Insert.
func (q *Queries) InsertNoReturning(events []core.Event) (string, []any, error) {
	return q.insert(events, q.insertOnePlain, "")
}

// insert is the INSERT of events followed by suffix; one, when set, is
// its text for a single event.
func (q *Queries) insert(events []core.Event, one, suffix string) (string, []any, error) {
	if len(events) == 1 && one != "" {
		// A producer's usual call: the statement is the same every time,
		// only its arguments are built.
		args, err := insertArgs(events, make([]any, 0, 6))
		return one, args, err
	}
	stmt, args, err := q.insertValues(events)
	if err != nil {
		return "", nil, err
	}
	return q.d.rebind(stmt + suffix), args, nil
}

// InsertedRows returns, on MySQL, the query of "id, created_at, event_id"
// of the rows an Insert of events wrote in this transaction, given the
// first id it assigned (LAST_INSERT_ID, the driver's LastInsertId), in id
// order. Rows are matched by event ID, not counted from the first id: ids
// of one statement need not be consecutive (auto_increment_increment,
// Galera), and other transactions' rows may lie between them.
func (q *Queries) InsertedRows(firstID int64, events []core.Event) (string, []any, error) {
	ids := make([]string, len(events))
	for i := range events {
		ids[i] = events[i].ID
	}
	js, err := json.Marshal(ids)
	if err != nil {
		return "", nil, fmt.Errorf("dialect: encode event IDs: %w", err)
	}
	return "SELECT o.id, o.created_at, o.event_id FROM " + q.t + " AS o JOIN JSON_TABLE(?, '$[*]' COLUMNS (event_id CHAR(36) CHARACTER SET ascii PATH '$')) AS j" +
		" ON o.event_id = j.event_id WHERE o.id >= ? ORDER BY o.id", []any{string(js), firstID}, nil
}

// insertValues is the INSERT ... VALUES of events with ? placeholders.
func (q *Queries) insertValues(events []core.Event) (string, []any, error) {
	if len(events) == 0 || len(events) > MaxInsertRows {
		return "", nil, fmt.Errorf("dialect: Insert takes 1 to %d events, got %d", MaxInsertRows, len(events))
	}
	row := "(?, ?, ?, ?, ?, ?)"
	if q.d.kind == kindPostgres {
		row = "(CAST(? AS uuid), ?, ?, ?, CAST(? AS jsonb), CAST(? AS jsonb))"
	}
	var b strings.Builder
	b.Grow(100 + len(events)*(len(row)+2))
	b.WriteString("INSERT INTO ")
	b.WriteString(q.t)
	b.WriteString(" (event_id, aggregate_type, aggregate_id, event_type, payload, headers) VALUES ")
	for i := range events {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(row)
	}
	args, err := insertArgs(events, make([]any, 0, 6*len(events)))
	if err != nil {
		return "", nil, err
	}
	return b.String(), args, nil
}

// insertArgs appends the six arguments of each event's row of an INSERT to
// args.
func insertArgs(events []core.Event, args []any) ([]any, error) {
	for i := range events {
		ev := &events[i]
		headers := "{}"
		if len(ev.Headers) > 0 {
			h, err := json.Marshal(ev.Headers)
			if err != nil {
				return nil, fmt.Errorf("dialect: marshal headers of event %s: %w", ev.ID, err)
			}
			headers = string(h)
		}
		args = append(args, ev.ID, ev.AggregateType, ev.AggregateID, ev.EventType, string(ev.Payload), headers)
	}
	return args, nil
}

// ErrNotAttachable is returned (wrapped) by InsertWith for a statement that
// cannot carry the outbox INSERT: one on a dialect without data-modifying
// WITH (SQLite), or one that is not a single INSERT, UPDATE, DELETE or
// SELECT, optionally with a WITH clause of its own.
var ErrNotAttachable = errors.New("dialect: statement cannot carry the outbox insert")

// InsertWith returns stmt with the INSERT of events (at most MaxInsertRows,
// each already Prepared) attached as a data-modifying WITH query, so that
// the business write and its events travel in one statement, one round
// trip (PostgreSQL only). stmt uses the placeholders $1 to $nargs; the
// events' parameters follow them, and the returned args are those of the
// events alone, to append to stmt's.
//
// PostgreSQL runs a data-modifying WITH query exactly once, whether or not
// the statement reads it, and in the same snapshot and transaction as the
// statement: the events are written if and only if the statement succeeds
// and its transaction commits. The statement's own result (rows affected,
// RETURNING rows) is unchanged.
func (q *Queries) InsertWith(stmt string, nargs int, events []core.Event) (string, []any, error) {
	if q.d.kind != kindPostgres {
		return "", nil, fmt.Errorf("%w: %s has no data-modifying WITH", ErrNotAttachable, q.d)
	}
	if nargs < 0 {
		return "", nil, fmt.Errorf("%w: negative argument count %d", ErrNotAttachable, nargs)
	}
	const space = " \t\r\n"
	body := strings.TrimLeft(stmt, space)
	keyword, rest := firstWord(body)
	prefix, sep := "WITH ", " "
	switch strings.ToUpper(keyword) {
	case "INSERT", "UPDATE", "DELETE", "SELECT":
	case "WITH":
		// Become the first query of the statement's own WITH list;
		// RECURSIVE allows non-recursive members too.
		body, sep = strings.TrimLeft(rest, space), ", "
		if w, r := firstWord(body); strings.EqualFold(w, "RECURSIVE") {
			prefix, body = "WITH RECURSIVE ", strings.TrimLeft(r, space)
		}
		if body == "" {
			return "", nil, fmt.Errorf("%w: nothing follows WITH", ErrNotAttachable)
		}
	default:
		return "", nil, fmt.Errorf("%w: it must start with INSERT, UPDATE, DELETE, SELECT or WITH, not %.20q", ErrNotAttachable, body)
	}
	ins, args, err := q.insertValues(events)
	if err != nil {
		return "", nil, err
	}
	var b strings.Builder
	b.Grow(len(stmt) + len(ins) + 64)
	b.WriteString(prefix)
	b.WriteString(withName)
	b.WriteString(" AS (")
	writeDollars(&b, ins, nargs)
	b.WriteString(")")
	b.WriteString(sep)
	b.WriteString(body)
	return b.String(), args, nil
}

// withName names the WITH query InsertWith adds; the statement it rides on
// must not name one of its own so.
const withName = "txoutbox_enqueue"

// firstWord splits s (without leading space) after its leading run of
// letters.
func firstWord(s string) (word, rest string) {
	i := 0
	for i < len(s) && (s[i] >= 'a' && s[i] <= 'z' || s[i] >= 'A' && s[i] <= 'Z') {
		i++
	}
	return s[:i], s[i:]
}

// Claim returns the statement that claims up to limit due events, oldest
// (next_attempt_at, id) first. With ClaimRowLocks run it inside the claim's
// transaction; with ClaimLease run it on its own: it stamps the rows with a
// lease of the given length, and its rows come back unordered (SortClaimed).
func (q *Queries) Claim(limit int, lease time.Duration) (string, []any) {
	if q.d.kind == kindSQLite {
		return q.claim, []any{sqliteModifier(lease), limit}
	}
	return q.claim, []any{limit}
}

// ReleaseLease returns the statement that gives leased rows back unchanged
// (ClaimLease only; "" on other dialects).
func (q *Queries) ReleaseLease(seqs []int64) (string, []any) {
	if q.d.kind != kindSQLite {
		return "", nil
	}
	return q.d.rebind("UPDATE " + q.t + " SET claimed_until = NULL WHERE id IN " + q.seqSet()), []any{q.seqArg(seqs)}
}

// MarkPublished returns one UPDATE marking all seqs published now,
// counting the attempt and clearing the error of an earlier one.
func (q *Queries) MarkPublished(seqs []int64) (string, []any) {
	set := "published_at = " + q.d.now() + ", attempt_count = attempt_count + 1, last_error = NULL"
	if q.d.kind == kindSQLite {
		set += ", claimed_until = NULL"
	}
	return q.updateSeqs(set, seqs)
}

// ClearLastError returns the UPDATE that clears last_error of seqs: the
// events a claim-and-mark claim published after an earlier failed attempt.
func (q *Queries) ClearLastError(seqs []int64) (string, []any) {
	return q.updateSeqs("last_error = NULL", seqs)
}

// updateSeqs returns the UPDATE of the rows of seqs with the SET list set,
// whose columns are unqualified. On MySQL the list is joined through
// JSON_TABLE, which the optimizer reads first and joins on the primary
// key; a single-table UPDATE ... WHERE id IN (subquery) may scan the table.
func (q *Queries) updateSeqs(set string, seqs []int64) (string, []any) {
	if q.d.kind == kindMySQL {
		return "UPDATE " + q.t + " JOIN " + mysqlSeqTable + " AS j ON " + q.t + ".id = j.seq SET " + set, []any{q.seqArg(seqs)}
	}
	return q.d.rebind("UPDATE " + q.t + " SET " + set + " WHERE id " + q.seqMatch()), []any{q.seqArg(seqs)}
}

// mysqlSeqTable is the table of a JSON array of Seqs (seqArg) on MySQL.
const mysqlSeqTable = "JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$'))"

// failureJSON is one failure as MarkFailed sends it to the database.
type failureJSON struct {
	Seq     int64  `json:"seq"`
	Err     string `json:"err"`
	RetryUS int64  `json:"retry_us"`      // PostgreSQL, MySQL
	Mod     string `json:"mod,omitempty"` // SQLite date modifier
	Dead    bool   `json:"dead"`
	DeadInt int    `json:"dead_i"` // MySQL: JSON_TABLE reads no JSON boolean on MariaDB
}

// MarkFailed returns one UPDATE recording every failure: last_error, one more
// attempt, next_attempt_at = the database's now + RetryIn, and dead_at = now
// for the Dead ones. The failures travel as one JSON argument, so the
// statement is the same size for 1 or 1000 of them.
func (q *Queries) MarkFailed(fs []core.Failure) (string, []any, error) {
	return q.markFailed(fs, true)
}

// markFailed is MarkFailed; count false leaves attempt_count alone and
// makes the rows pending again (UnclaimFailed).
func (q *Queries) markFailed(fs []core.Failure, count bool) (string, []any, error) {
	rows := make([]failureJSON, len(fs))
	for i, f := range fs {
		// PostgreSQL text cannot hold NUL; a broker error containing one
		// must not make the whole outcome unrecordable.
		rows[i] = failureJSON{Seq: f.Seq, Err: strings.ReplaceAll(f.Err, "\x00", ""), Dead: f.Dead}
		if q.d.kind == kindSQLite {
			rows[i].Mod = sqliteModifier(f.RetryIn)
		} else {
			rows[i].RetryUS = f.RetryIn.Microseconds()
		}
		if f.Dead {
			rows[i].DeadInt = 1
		}
	}
	js, err := json.Marshal(rows)
	if err != nil {
		return "", nil, fmt.Errorf("dialect: encode failures: %w", err)
	}
	now := q.d.now()
	var s string
	switch q.d.kind {
	case kindPostgres:
		set := "attempt_count = o.attempt_count + 1"
		if !count {
			set = "published_at = NULL"
		}
		s = "UPDATE " + q.t + " AS o SET " + set + ", last_error = f.err," +
			" next_attempt_at = " + now + " + f.retry_us * interval '1 microsecond'," +
			" dead_at = CASE WHEN f.dead THEN " + now + " END" +
			" FROM jsonb_to_recordset(CAST(? AS jsonb)) AS f(seq bigint, err text, retry_us bigint, dead boolean)" +
			" WHERE o.id = f.seq"
	case kindMySQL:
		set := "o.attempt_count = o.attempt_count + 1"
		if !count {
			set = "o.published_at = NULL"
		}
		s = "UPDATE " + q.t + " AS o JOIN JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$.seq', err LONGTEXT PATH '$.err'," +
			" retry_us BIGINT PATH '$.retry_us', dead INT PATH '$.dead_i')) AS f ON o.id = f.seq" +
			" SET " + set + ", o.last_error = f.err, o.next_attempt_at = " + now + " + INTERVAL f.retry_us MICROSECOND," +
			" o.dead_at = CASE WHEN f.dead = 1 THEN " + now + " END"
	case kindSQLite:
		s = "UPDATE " + q.t + " AS o SET attempt_count = o.attempt_count + 1, last_error = f.err," +
			" next_attempt_at = strftime('%Y-%m-%dT%H:%M:%fZ','now',f.mod)," +
			" dead_at = CASE WHEN f.dead THEN " + now + " END, claimed_until = NULL" +
			" FROM (SELECT json_extract(value,'$.seq') AS seq, json_extract(value,'$.err') AS err," +
			" json_extract(value,'$.mod') AS mod, json_extract(value,'$.dead') AS dead FROM json_each(?)) AS f" +
			" WHERE o.id = f.seq"
	}
	return q.d.rebind(s), []any{string(js)}, nil
}

// Stats returns the query whose rows CollectStats reads: per event type the
// pending and dead counts, the oldest pending created_at and its age by the
// database's clock. It reads every unpublished row, so run it every few
// seconds, not per event.
func (q *Queries) Stats() string { return q.stats }

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

// DeadFilter selects dead-lettered events. Set fields are combined with AND.
// Retry and purge refuse an empty filter unless All is set, so that a
// forgotten flag cannot re-queue or delete every dead event.
type DeadFilter struct {
	// Seqs selects events by their store position (Event.Seq).
	Seqs []int64
	// EventIDs selects events by ID (UUIDs).
	EventIDs []string
	// EventType selects one event type.
	EventType string
	// DeadBefore selects events dead-lettered before this time.
	DeadBefore time.Time
	// All confirms that an otherwise empty filter means every dead event.
	All bool
}

func (f DeadFilter) empty() bool {
	return len(f.Seqs) == 0 && len(f.EventIDs) == 0 && f.EventType == "" && f.DeadBefore.IsZero()
}

// Page bounds a listing: events with Seq > AfterSeq, at most Limit of them
// (default 100), in Seq order. Pass the last Seq of a page to get the next.
type Page struct {
	AfterSeq int64
	Limit    int
}

func (q *Queries) deadWhere(f DeadFilter) (string, []any, error) {
	w := []string{"dead_at IS NOT NULL"}
	var args []any
	if len(f.Seqs) > 0 {
		w = append(w, "id "+q.seqMatch())
		args = append(args, q.seqArg(f.Seqs))
	}
	if len(f.EventIDs) > 0 {
		c, a, err := q.eventIDMatch(f.EventIDs)
		if err != nil {
			return "", nil, err
		}
		w = append(w, c)
		args = append(args, a)
	}
	if f.EventType != "" {
		w = append(w, "event_type = ?")
		args = append(args, f.EventType)
	}
	if !f.DeadBefore.IsZero() {
		w = append(w, "dead_at < ?")
		args = append(args, q.d.TimeArg(f.DeadBefore))
	}
	return strings.Join(w, " AND "), args, nil
}

// ListDead returns the query for dead events matching f (an empty filter
// lists all), one page in Seq order.
func (q *Queries) ListDead(f DeadFilter, p Page) (string, []any, error) {
	where, args, err := q.deadWhere(f)
	if err != nil {
		return "", nil, err
	}
	if p.Limit <= 0 {
		p.Limit = 100
	}
	args = append(args, p.AfterSeq, p.Limit)
	return q.d.rebind("SELECT " + q.cols + " FROM " + q.t + " WHERE " + where + " AND id > ? ORDER BY id LIMIT ?"), args, nil
}

// RetryDead returns the UPDATE that re-queues the dead events matching f:
// dead_at cleared, attempt_count reset to 0 (a fresh budget of attempts),
// next_attempt_at = now. last_error is kept for the record.
func (q *Queries) RetryDead(f DeadFilter) (string, []any, error) {
	if f.empty() && !f.All {
		return "", nil, fmt.Errorf("%w: empty dead-letter filter; set All to re-queue every dead event", ErrInvalidFilter)
	}
	where, args, err := q.deadWhere(f)
	if err != nil {
		return "", nil, err
	}
	set := "dead_at = NULL, attempt_count = 0, next_attempt_at = " + q.d.now()
	if q.d.kind == kindSQLite {
		set += ", claimed_until = NULL"
	}
	return q.d.rebind("UPDATE " + q.t + " SET " + set + " WHERE " + where), args, nil
}

// PurgeDead returns the DELETE of the dead events matching f.
func (q *Queries) PurgeDead(f DeadFilter) (string, []any, error) {
	if f.empty() && !f.All {
		return "", nil, fmt.Errorf("%w: empty dead-letter filter; set All to purge every dead event", ErrInvalidFilter)
	}
	where, args, err := q.deadWhere(f)
	if err != nil {
		return "", nil, err
	}
	return q.d.rebind("DELETE FROM " + q.t + " WHERE " + where), args, nil
}

// ReplayFilter selects published events to publish again. Set fields are
// combined with AND; an empty filter is refused unless All is set.
type ReplayFilter struct {
	// FromSeq and ToSeq bound Event.Seq, both inclusive; 0 leaves a side
	// open.
	FromSeq, ToSeq int64
	// CreatedFrom (inclusive) and CreatedTo (exclusive) bound CreatedAt;
	// the zero time leaves a side open.
	CreatedFrom, CreatedTo time.Time
	// AggregateType, AggregateID and EventType select exact values.
	AggregateType string
	AggregateID   string
	EventType     string
	// All confirms that an otherwise empty filter means every published
	// event still in the table.
	All bool
}

func (f ReplayFilter) empty() bool {
	return f.FromSeq == 0 && f.ToSeq == 0 && f.CreatedFrom.IsZero() && f.CreatedTo.IsZero() &&
		f.AggregateType == "" && f.AggregateID == "" && f.EventType == ""
}

// Replay returns the UPDATE that makes the published events matching f
// pending again: published_at cleared, attempt_count reset, next_attempt_at
// = now. The relay then publishes them as if new (same event IDs, so
// consumers' inboxes will skip what they already processed). It is one
// statement: replay a very large range in several calls by Seq range.
func (q *Queries) Replay(f ReplayFilter) (string, []any, error) {
	if f.empty() && !f.All {
		return "", nil, fmt.Errorf("%w: empty replay filter; set All to replay every published event", ErrInvalidFilter)
	}
	if f.FromSeq < 0 || f.ToSeq < 0 || (f.ToSeq != 0 && f.ToSeq < f.FromSeq) {
		return "", nil, fmt.Errorf("%w: bad seq range %d..%d", ErrInvalidFilter, f.FromSeq, f.ToSeq)
	}
	w := []string{"published_at IS NOT NULL"}
	var args []any
	add := func(cond string, arg any) {
		w = append(w, cond)
		args = append(args, arg)
	}
	if f.FromSeq != 0 {
		add("id >= ?", f.FromSeq)
	}
	if f.ToSeq != 0 {
		add("id <= ?", f.ToSeq)
	}
	if !f.CreatedFrom.IsZero() {
		add("created_at >= ?", q.d.TimeArg(f.CreatedFrom))
	}
	if !f.CreatedTo.IsZero() {
		add("created_at < ?", q.d.TimeArg(f.CreatedTo))
	}
	if f.AggregateType != "" {
		add("aggregate_type = ?", f.AggregateType)
	}
	if f.AggregateID != "" {
		add("aggregate_id = ?", f.AggregateID)
	}
	if f.EventType != "" {
		add("event_type = ?", f.EventType)
	}
	return q.d.rebind("UPDATE " + q.t + " SET published_at = NULL, attempt_count = 0, next_attempt_at = " + q.d.now() +
		" WHERE " + strings.Join(w, " AND ")), args, nil
}

// seqMatch is the condition "id is one of the list passed as seqArg". On
// PostgreSQL it is = ANY of an array that travels as text, which any driver
// can bind, and which the planner turns into one index scan.
func (q *Queries) seqMatch() string {
	switch q.d.kind {
	case kindPostgres:
		return "= ANY(CAST(CAST(? AS text) AS bigint[]))"
	case kindMySQL:
		// For the operators' filters, which also select dead_at IS NOT
		// NULL by its index; hot paths join instead (updateSeqs).
		return "IN (SELECT seq FROM " + mysqlSeqTable + " AS j)"
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
