package dialect

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// Time scans a timestamp column of any dialect: a time.Time from drivers
// that parse timestamps (pgx), or the text SQLite stores. Valid is false for
// NULL.
type Time struct {
	Time  time.Time
	Valid bool
}

// Scan implements sql.Scanner.
func (t *Time) Scan(v any) error {
	var s string
	switch v := v.(type) {
	case nil:
		*t = Time{}
		return nil
	case time.Time:
		*t = Time{Time: v, Valid: true}
		return nil
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		return fmt.Errorf("txoutbox/dialect: cannot scan %T into a timestamp", v)
	}
	for _, layout := range []string{sqliteTimeFormat, time.RFC3339Nano, "2006-01-02 15:04:05.999999999Z07:00", "2006-01-02 15:04:05.999999999"} {
		if p, err := time.Parse(layout, s); err == nil {
			*t = Time{Time: p.UTC(), Valid: true}
			return nil
		}
	}
	return fmt.Errorf("txoutbox/dialect: cannot parse timestamp %q", s)
}

func (t Time) ptr() *time.Time {
	if !t.Valid {
		return nil
	}
	v := t.Time
	return &v
}

// ScanEvent reads one row of an event-returning statement of Queries (Claim,
// GetByEventID, GetBySeq, ListDead); scan is (*sql.Rows).Scan or
// (*sql.Row).Scan.
func ScanEvent(scan func(dest ...any) error) (core.Event, error) {
	var (
		ev                                    core.Event
		payload, headers                      []byte
		lastError                             sql.NullString
		created, published, nextAttempt, dead Time
	)
	if err := scan(&ev.Seq, &ev.ID, &ev.AggregateType, &ev.AggregateID, &ev.EventType, &payload, &headers,
		&created, &published, &ev.AttemptCount, &lastError, &nextAttempt, &dead); err != nil {
		return core.Event{}, err
	}
	ev.Payload = json.RawMessage(payload)
	if len(headers) > 0 && string(headers) != "{}" {
		if err := json.Unmarshal(headers, &ev.Headers); err != nil {
			return core.Event{}, fmt.Errorf("txoutbox/dialect: headers of event %d: %w", ev.Seq, err)
		}
	}
	ev.CreatedAt = created.Time
	ev.PublishedAt = published.ptr()
	ev.LastError = lastError.String
	ev.NextAttemptAt = nextAttempt.Time
	ev.DeadAt = dead.ptr()
	return ev, nil
}

// CollectEvents reads and closes rows of an event-returning statement.
func CollectEvents(rows *sql.Rows) ([]core.Event, error) {
	defer rows.Close()
	var evs []core.Event
	for rows.Next() {
		ev, err := ScanEvent(rows.Scan)
		if err != nil {
			return nil, err
		}
		evs = append(evs, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return evs, rows.Close()
}

// SortClaimed puts claimed events into claim order (next_attempt_at, then
// Seq), which a lease claim's RETURNING does not keep.
func SortClaimed(evs []core.Event) {
	slices.SortFunc(evs, func(a, b core.Event) int {
		if c := a.NextAttemptAt.Compare(b.NextAttemptAt); c != 0 {
			return c
		}
		switch {
		case a.Seq < b.Seq:
			return -1
		case a.Seq > b.Seq:
			return 1
		}
		return 0
	})
}

// CollectStats reads and closes the rows of the Stats query.
func CollectStats(rows *sql.Rows) (core.Stats, error) {
	defer rows.Close()
	s := core.Stats{ByType: map[string]core.TypeStats{}}
	for rows.Next() {
		var (
			typ           string
			pending, dead int64
			oldest        Time
			age           sql.NullFloat64
		)
		if err := rows.Scan(&typ, &pending, &dead, &oldest, &age); err != nil {
			return core.Stats{}, err
		}
		ts := core.TypeStats{Pending: pending, Dead: dead}
		if age.Valid && pending > 0 {
			ts.OldestPendingAge = max(secondsToDuration(age.Float64), 0)
		}
		s.ByType[typ] = ts
		s.Pending += pending
		s.Dead += dead
		if oldest.Valid && pending > 0 && (s.OldestPending.IsZero() || oldest.Time.Before(s.OldestPending)) {
			s.OldestPending = oldest.Time
		}
		s.OldestPendingAge = max(s.OldestPendingAge, ts.OldestPendingAge)
	}
	if err := rows.Err(); err != nil {
		return core.Stats{}, err
	}
	return s, rows.Close()
}

func secondsToDuration(s float64) time.Duration {
	if s*1e9 > math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * float64(time.Second))
}
