package dialect

import (
	"fmt"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// InboxQueries is the SQL of the consumer-side inbox table (processed_events:
// consumer, event_id, processed_at; primary key (consumer, event_id)).
type InboxQueries struct {
	d      Dialect
	id     Identifier
	insert string
	del    string
	exists string
}

// InboxQueries returns the statements for the inbox table named table (""
// selects DefaultInboxTable), validated like Queries.
func (d Dialect) InboxQueries(table string) (*InboxQueries, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	if table == "" {
		table = DefaultInboxTable
	}
	id, err := ValidateIdentifier(table)
	if err != nil {
		return nil, err
	}
	t := d.qualified(id)
	q := &InboxQueries{
		d:      d,
		id:     id,
		insert: d.rebind("INSERT INTO " + t + " (consumer, event_id) VALUES (?, ?) ON CONFLICT DO NOTHING"),
		del: d.rebind("DELETE FROM " + t + " WHERE (consumer, event_id) IN (SELECT consumer, event_id FROM " + t +
			" WHERE processed_at < ? ORDER BY processed_at LIMIT ?)"),
		exists: d.rebind("SELECT 1 FROM " + t + " WHERE consumer = ? AND event_id = ?"),
	}
	if d.kind == kindMySQL {
		// INSERT IGNORE affects no row for a duplicate key. It would also
		// turn a too-long value into a truncated one with a warning: the
		// inbox refuses values over MaxInboxKeyBytes before it runs.
		q.insert = "INSERT IGNORE INTO " + t + " (consumer, event_id) VALUES (?, ?)"
		q.del = "DELETE FROM " + t + " WHERE processed_at < ? ORDER BY processed_at LIMIT ?"
	}
	return q, nil
}

// MaxInboxKeyBytes bounds the consumer name and the event ID an inbox
// records (VARCHAR(255) on MySQL, where a longer value would be truncated;
// the same bound everywhere, so that a consumer behaves alike on every
// database). Event IDs are UUIDs, 36 bytes.
const MaxInboxKeyBytes = 255

// CheckInboxKey refuses a consumer name or event ID longer than
// MaxInboxKeyBytes, with an error wrapping core.ErrInvalidOptions (for the
// consumer) or core.ErrInvalidEvent (for the event ID).
func CheckInboxKey(consumer, eventID string) error {
	if len(consumer) > MaxInboxKeyBytes {
		return fmt.Errorf("%w: consumer name of %d bytes, over %d", core.ErrInvalidOptions, len(consumer), MaxInboxKeyBytes)
	}
	if len(eventID) > MaxInboxKeyBytes {
		return fmt.Errorf("%w: event_id of %d bytes, over %d", core.ErrInvalidEvent, len(eventID), MaxInboxKeyBytes)
	}
	return nil
}

// Table returns the validated inbox table name.
func (q *InboxQueries) Table() Identifier { return q.id }

// Record returns the INSERT that records (consumer, eventID) as processed.
// It affects one row the first time and none for a duplicate, so run it in
// the handler's transaction and skip the handler when RowsAffected is 0.
func (q *InboxQueries) Record(consumer, eventID string) (string, []any) {
	return q.insert, []any{consumer, eventID}
}

// Exists returns the query that yields a row when (consumer, eventID) was
// processed.
func (q *InboxQueries) Exists(consumer, eventID string) (string, []any) {
	return q.exists, []any{consumer, eventID}
}

// DeleteProcessedBefore returns the DELETE of at most limit records processed
// before the given time, oldest first. Keep records at least as long as a
// broker may redeliver.
func (q *InboxQueries) DeleteProcessedBefore(before time.Time, limit int) (string, []any) {
	return q.del, []any{q.d.TimeArg(before), limit}
}
