// Package logrelay is log mode: a relay that reads the outbox's events from
// PostgreSQL's write-ahead log through a logical replication slot, instead
// of claiming rows from the outbox table.
//
// Setup puts a trigger on the outbox table that sends every inserted event
// to the log as a transactional logical decoding message
// (pg_logical_emit_message) and keeps the row out of the table. Producers
// keep their code: Enqueue, ExecWithEvents and the GORM plugin write as in
// table mode (in log mode they do not get Seq and CreatedAt back). The
// Relay streams the messages of committed transactions from the slot
// (pgoutput), publishes them and confirms the slot's position once the
// broker took every event before it: no write per event, at least once,
// and a relay killed at any point streams again from the last confirmed
// position. An event whose publish fails is written to the outbox table,
// where a core.Relay running alongside retries it with the table mode's
// attempts, backoff and dead letters; in ordered mode the later events of
// its aggregate follow it there.
//
// See docs/log-mode.md for when to choose it, its guarantees and its
// operations.
package logrelay
