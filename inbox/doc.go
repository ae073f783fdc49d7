// Package inbox makes each event take effect once per consumer: it is the
// consumer half of the transactional outbox.
//
// Delivery from the relay is at least once, so a consumer sees duplicates:
// a relay that crashed between publishing and recording, a broker confirm
// that was lost, a redelivery after a nack. The inbox records the event's ID
// (the HeaderEventID metadata) in the table processed_events, in the same
// database transaction as the handler's own writes:
//
//	BEGIN;
//	INSERT INTO processed_events (consumer, event_id) VALUES (..) ON CONFLICT DO NOTHING;
//	-- 0 rows: already processed, ROLLBACK and ack without running the handler
//	handler(msg)  -- its writes use the same transaction, taken from the context
//	COMMIT;       -- the record and the effect become visible together
//
// A handler error rolls both back, and the router nacks the message so that
// the broker redelivers it. Two deliveries of one event that run at once (two
// instances of one consumer group) take effect once: on PostgreSQL the second
// INSERT waits on the first transaction's uncommitted row and then sees the
// conflict (or, if the first rolled back, inserts and runs); on SQLite the
// writers serialize.
//
// The pieces:
//
//   - NewMiddleware turns any core.Inbox into a Watermill
//     message.HandlerMiddleware for a router.
//   - sqlinbox.New is the core.Inbox on database/sql (*sql.DB, *sqlx.DB);
//     handlers reach the transaction with sqlinbox.Tx or sqlinbox.Txx.
//     gorminbox.New is the same on GORM and pgxinbox.New on pgx, each in
//     its own package so that sqlx users do not compile GORM or pgx.
//   - Cleanup and RunCleanup delete old records in bounded batches.
//
// The ID a consumer dedups on must be stable across redeliveries: that is
// why the relay sends the outbox event's own ID, never a broker message ID.
package inbox
