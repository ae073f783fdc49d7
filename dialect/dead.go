package dialect

import (
	"fmt"
	"strings"
	"time"
)

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
	switch {
	case len(f.Seqs) > 0 && q.d.kind == kindMySQL:
		// One placeholder per Seq, an operator's short list: MariaDB finds
		// each by primary key, where IN (SELECT … FROM JSON_TABLE) reads
		// the key from its start and, in RetryDead and PurgeDead, locks
		// every row it passes, the rows the relays claim among them.
		w = append(w, "id IN (?"+strings.Repeat(", ?", len(f.Seqs)-1)+")")
		for _, s := range f.Seqs {
			args = append(args, s)
		}
	case len(f.Seqs) > 0:
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
