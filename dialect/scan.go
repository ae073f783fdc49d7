package dialect

import (
	"cmp"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"

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
		return fmt.Errorf("dialect: cannot scan %T into a timestamp", v)
	}
	for _, layout := range []string{sqliteTimeFormat, time.RFC3339Nano, "2006-01-02 15:04:05.999999999Z07:00", "2006-01-02 15:04:05.999999999"} {
		if p, err := time.Parse(layout, s); err == nil {
			*t = Time{Time: p.UTC(), Valid: true}
			return nil
		}
	}
	return fmt.Errorf("dialect: cannot parse timestamp %q", s)
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
	h, err := DecodeHeaders(headers)
	if err != nil {
		return core.Event{}, fmt.Errorf("dialect: headers of event %d: %w", ev.Seq, err)
	}
	ev.Headers = h
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
	// The claim's rows usually come back in claim order already, and
	// sorting compares and moves whole events (some 200 bytes each): check
	// first, by pointer.
	sorted := true
	for i := 1; i < len(evs); i++ {
		if compareClaimed(&evs[i-1], &evs[i]) > 0 {
			sorted = false
			break
		}
	}
	if sorted {
		return
	}
	slices.SortFunc(evs, func(a, b core.Event) int { return compareClaimed(&a, &b) })
}

// compareClaimed orders events by claim order: next_attempt_at, then seq.
func compareClaimed(a, b *core.Event) int {
	if c := a.NextAttemptAt.Compare(b.NextAttemptAt); c != 0 {
		return c
	}
	return cmp.Compare(a.Seq, b.Seq)
}

// CollectStats reads and closes the rows of the Stats query.
func CollectStats(rows *sql.Rows) (core.Stats, error) {
	defer rows.Close()
	s := core.Stats{ByType: map[string]core.TypeStats{}}
	for rows.Next() {
		var (
			typ                      string
			pending, dead, scheduled int64
			oldest                   Time
			age                      sql.NullFloat64
		)
		if err := rows.Scan(&typ, &pending, &dead, &oldest, &age, &scheduled); err != nil {
			return core.Stats{}, err
		}
		ts := core.TypeStats{Pending: pending, Dead: dead, Scheduled: scheduled}
		s.Scheduled += scheduled
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

// DecodeHeaders decodes the headers column of an event row, as ScanEvent
// does: nil for an empty object. It is for stores that scan rows without
// database/sql.
func DecodeHeaders(b []byte) (map[string]string, error) {
	if len(b) == 0 || string(b) == "{}" {
		return nil, nil
	}
	return decodeHeaders(b)
}

// decodeHeaders decodes a JSON object of strings. Headers are read for every
// claimed event and encoding/json's reflection was the relay's largest CPU
// cost, so the plain case (no escapes, valid UTF-8) is parsed directly;
// anything else goes to encoding/json, whose result is the reference.
func decodeHeaders(b []byte) (map[string]string, error) {
	if h, ok := decodeFlatObject(b); ok {
		return h, nil
	}
	var h map[string]string
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, err
	}
	return h, nil
}

func decodeFlatObject(b []byte) (map[string]string, bool) {
	i := 0
	ws := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
	}
	str := func() (string, bool) {
		if i >= len(b) || b[i] != '"' {
			return "", false
		}
		i++
		start := i
		for i < len(b) && b[i] != '"' {
			if b[i] == '\\' || b[i] < 0x20 {
				return "", false
			}
			i++
		}
		if i >= len(b) || !utf8.Valid(b[start:i]) {
			return "", false
		}
		i++
		return string(b[start : i-1]), true
	}
	ws()
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	i++
	h := map[string]string{}
	ws()
	if i < len(b) && b[i] == '}' {
		i++
		ws()
		return h, i == len(b)
	}
	for {
		ws()
		k, ok := str()
		if !ok {
			return nil, false
		}
		ws()
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i++
		ws()
		v, ok := str()
		if !ok {
			return nil, false
		}
		h[k] = v // a repeated key keeps the last value, as encoding/json does
		ws()
		if i >= len(b) {
			return nil, false
		}
		if b[i] == '}' {
			i++
			ws()
			return h, i == len(b)
		}
		if b[i] != ',' {
			return nil, false
		}
		i++
	}
}
