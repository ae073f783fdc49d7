package binlogrelay

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/logstream"
)

// table is the outbox table as the stream hands it events: a row handed to
// the log goes back to the table relay by setting its published_at to
// NULL, with its attempt, error and backoff.
type table struct {
	db     *sql.DB
	handQ  string
	heldQ  string
	insert string
	exists string
}

func newTable(db *sql.DB, r resolved, ropts core.RelayOptions) *table {
	t := &table{
		db: db,
		// Only a row as the producer left it: one the retry path already
		// has (written before a crash, then read from the binlog again)
		// or published keeps its state.
		handQ: "UPDATE " + r.quoted + " AS o JOIN JSON_TABLE(?, '$[*]' COLUMNS (" +
			"id BIGINT PATH '$.id', pub DATETIME(6) PATH '$.pub', attempts INT PATH '$.a', err LONGTEXT PATH '$.e', " +
			"retry BIGINT PATH '$.r', dead INT PATH '$.d')) AS j ON o.id = j.id" +
			" SET o.published_at = NULL, o.attempt_count = j.attempts, o.last_error = j.err," +
			" o.next_attempt_at = GREATEST(UTC_TIMESTAMP(6) + INTERVAL j.retry MICROSECOND, o.next_attempt_at), o.dead_at = IF(j.dead = 1, UTC_TIMESTAMP(6), NULL)" +
			" WHERE o.published_at = j.pub AND o.attempt_count = 0 AND o.last_error IS NULL",
		// A scheduled row (its next_attempt_at the producer's NotBefore)
		// holds nothing back.
		heldQ: "SELECT DISTINCT aggregate_id FROM " + r.quoted + " WHERE published_at IS NULL AND aggregate_id <> ''" +
			" AND NOT (attempt_count = 0 AND next_attempt_at > UTC_TIMESTAMP(6))",
		insert: "INSERT IGNORE INTO " + r.quoted + " (id, event_id, aggregate_type, aggregate_id, event_type, payload, headers," +
			" created_at, published_at, attempt_count, last_error, next_attempt_at, dead_at) VALUES ",
		exists: "SELECT id FROM " + r.quoted + " WHERE id IN (",
	}
	if ropts.Ordered.DeadLetter == core.DeadLetterSkip {
		t.heldQ += " AND dead_at IS NULL"
	}
	return t
}

// handed is one row of handQ's JSON.
type handed struct {
	ID       int64   `json:"id"`
	Pub      string  `json:"pub"`
	Attempts int     `json:"a"`
	Err      *string `json:"e"`
	RetryUS  int64   `json:"r"`
	Dead     int     `json:"d"`
}

// Write hands rows to the table's retry path in one transaction. A row
// that cleanup already deleted is written again.
func (t *table) Write(ctx context.Context, rows []logstream.Row) error {
	tx, err := t.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	js := make([]handed, len(rows))
	for i, r := range rows {
		h := handed{ID: r.Event.Seq}
		if r.Event.PublishedAt != nil {
			h.Pub = r.Event.PublishedAt.UTC().Format(datetimeLayout)
		}
		if f := r.Failure; f != nil {
			h.Attempts, h.Err, h.RetryUS = 1, &f.Err, f.RetryIn.Microseconds()
			if f.Dead {
				h.Dead = 1
			}
		}
		js[i] = h
	}
	b, err := json.Marshal(js)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, t.handQ, string(b)); err != nil {
		return err
	}
	missing, err := t.missing(ctx, tx, rows)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		q, args, err := t.insertRows(missing, js, rows)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// missing returns the indexes of rows no longer in the table.
func (t *table) missing(ctx context.Context, tx *sql.Tx, rows []logstream.Row) ([]int, error) {
	args := make([]any, len(rows))
	for i, r := range rows {
		args[i] = r.Event.Seq
	}
	res, err := tx.QueryContext(ctx, t.exists+strings.TrimSuffix(strings.Repeat("?, ", len(rows)), ", ")+")", args...)
	if err != nil {
		return nil, err
	}
	defer res.Close()
	have := map[int64]bool{}
	for res.Next() {
		var id int64
		if err := res.Scan(&id); err != nil {
			return nil, err
		}
		have[id] = true
	}
	if err := res.Err(); err != nil {
		return nil, err
	}
	var out []int
	for i, r := range rows {
		if !have[r.Event.Seq] {
			out = append(out, i)
		}
	}
	return out, nil
}

func (t *table) insertRows(idx []int, js []handed, rows []logstream.Row) (string, []any, error) {
	var b strings.Builder
	b.WriteString(t.insert)
	var args []any
	for k, i := range idx {
		if k > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, GREATEST(UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, COALESCE(?, UTC_TIMESTAMP(6))), IF(? = 1, UTC_TIMESTAMP(6), NULL))")
		ev, h := rows[i].Event, js[i]
		headers := "{}"
		if len(ev.Headers) > 0 {
			hb, err := json.Marshal(ev.Headers)
			if err != nil {
				return "", nil, fmt.Errorf("binlogrelay: headers of event %s: %w", ev.ID, err)
			}
			headers = string(hb)
		}
		var notBefore any
		if rows[i].Failure == nil && !ev.NotBefore.IsZero() {
			notBefore = ev.NotBefore.UTC()
		}
		args = append(args, ev.Seq, ev.ID, ev.AggregateType, ev.AggregateID, ev.EventType, string(ev.Payload), headers,
			ev.CreatedAt.UTC(), h.Attempts, h.Err, h.RetryUS, notBefore, h.Dead)
	}
	return b.String(), args, nil
}

// Held returns the aggregates that have unpublished rows in the table.
func (t *table) Held(ctx context.Context) ([]string, error) {
	rows, err := t.db.QueryContext(ctx, t.heldQ)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}
