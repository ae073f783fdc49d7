package dialect

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

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
	if len(events) == 1 && one != "" && events[0].NotBefore.IsZero() {
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
	row := "(?, ?, ?, ?, ?, ?"
	if q.d.kind == kindPostgres {
		row = "(CAST(? AS uuid), ?, ?, ?, CAST(? AS jsonb), CAST(? AS jsonb)"
	}
	cols := " (event_id, aggregate_type, aggregate_id, event_type, payload, headers) VALUES "
	scheduled := slices.ContainsFunc(events, func(e core.Event) bool { return !e.NotBefore.IsZero() })
	if scheduled {
		// Only a statement with a scheduled event names next_attempt_at,
		// so that every other insert stays the one the server knows.
		cols = " (event_id, aggregate_type, aggregate_id, event_type, payload, headers, next_attempt_at) VALUES "
		row += ", " + q.d.notBefore()
	}
	row += ")"
	var b strings.Builder
	b.Grow(100 + len(events)*(len(row)+2))
	b.WriteString("INSERT INTO ")
	b.WriteString(q.t)
	b.WriteString(cols)
	for i := range events {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(row)
	}
	args, err := insertArgs(events, make([]any, 0, 7*len(events)))
	if err != nil {
		return "", nil, err
	}
	if scheduled {
		args = q.d.appendNotBefore(events, args)
	}
	return b.String(), args, nil
}

// notBefore is the SQL of one row's next_attempt_at in an insert of
// scheduled events: the later of the bound NotBefore (NULL when the event
// has none) and the column's default, so that a time already past means
// now and never dates the event's lag before its writing.
func (d Dialect) notBefore() string {
	switch d.kind {
	case kindSQLite:
		return "max(COALESCE(?, " + sqliteNow + "), " + sqliteNow + ")"
	case kindMySQL:
		return "GREATEST(COALESCE(CAST(? AS DATETIME(6)), " + mysqlNow + "), " + mysqlNow + ")"
	}
	return "GREATEST(CAST(? AS timestamptz), now())"
}

// appendNotBefore moves each row's NotBefore argument into place: every
// row's six arguments are followed by its seventh. A time is rounded up
// to the database's resolution (microseconds; milliseconds on SQLite), so
// that rounding never makes an event due early.
func (d Dialect) appendNotBefore(events []core.Event, six []any) []any {
	res := time.Microsecond
	if d.kind == kindSQLite {
		res = time.Millisecond
	}
	args := make([]any, 0, 7*len(events))
	for i := range events {
		args = append(args, six[6*i:6*i+6]...)
		nb := events[i].NotBefore
		if nb.IsZero() {
			args = append(args, nil)
			continue
		}
		if t := nb.Truncate(res); t.Before(nb) {
			nb = t.Add(res)
		}
		args = append(args, d.TimeArg(nb))
	}
	return args
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
