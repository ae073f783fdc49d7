package binlogrelay

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// datetimeLayout is how the binlog reader prints DATETIME(6) values.
const datetimeLayout = "2006-01-02 15:04:05.999999"

// decodeRow turns a row of the outbox table, as the binlog carries it
// (names are its columns, in order), into an event. ok is false for a row
// not handed to the log: published_at NULL, the relay's own writes to the
// retry path, or a producer's explicit NULL (the table relay's then).
func decodeRow(names []string, row []any) (ev core.Event, ok bool, err error) {
	if len(names) != len(row) {
		return ev, false, fmt.Errorf("%d values for %d columns", len(row), len(names))
	}
	var pub any
	for i, name := range names {
		v := row[i]
		switch strings.ToLower(name) {
		case "id":
			ev.Seq, err = toInt64(v)
		case "event_id":
			ev.ID = toString(v)
		case "aggregate_type":
			ev.AggregateType = toString(v)
		case "aggregate_id":
			ev.AggregateID = toString(v)
		case "event_type":
			ev.EventType = toString(v)
		case "payload":
			ev.Payload = json.RawMessage(toString(v))
		case "headers":
			if h := toString(v); h != "" && h != "{}" {
				err = json.Unmarshal([]byte(h), &ev.Headers)
			}
		case "created_at":
			ev.CreatedAt, err = toTime(v)
		case "published_at":
			pub = v
		case "next_attempt_at":
			ev.NextAttemptAt, err = toTime(v)
		}
		if err != nil {
			return ev, false, fmt.Errorf("column %s: %w", name, err)
		}
	}
	if pub == nil {
		return ev, false, nil
	}
	// The row's published_at is when it was handed to the log; the retry
	// path changes the row only while it still has this value.
	p, err := toTime(pub)
	if err != nil {
		return ev, false, fmt.Errorf("column published_at: %w", err)
	}
	ev.PublishedAt = &p
	if ev.NextAttemptAt.After(ev.CreatedAt) {
		// Scheduled: the stream hands it to the table.
		ev.NotBefore = ev.NextAttemptAt
	} else {
		ev.NextAttemptAt = ev.CreatedAt
	}
	return ev, true, nil
}

func toString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

func toInt64(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case int32:
		return int64(x), nil
	case uint64:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case int:
		return int64(x), nil
	}
	return 0, fmt.Errorf("unexpected %T", v)
}

func toTime(v any) (time.Time, error) {
	switch x := v.(type) {
	case time.Time:
		return x.UTC(), nil
	case string:
		return time.ParseInLocation(datetimeLayout, x, time.UTC)
	case []byte:
		return time.ParseInLocation(datetimeLayout, string(x), time.UTC)
	}
	return time.Time{}, fmt.Errorf("unexpected %T", v)
}
