package dialect

import "time"

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
	return &InboxQueries{
		d:      d,
		id:     id,
		insert: d.rebind("INSERT INTO " + t + " (consumer, event_id) VALUES (?, ?) ON CONFLICT DO NOTHING"),
		del: d.rebind("DELETE FROM " + t + " WHERE (consumer, event_id) IN (SELECT consumer, event_id FROM " + t +
			" WHERE processed_at < ? ORDER BY processed_at LIMIT ?)"),
		exists: d.rebind("SELECT 1 FROM " + t + " WHERE consumer = ? AND event_id = ?"),
	}, nil
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
