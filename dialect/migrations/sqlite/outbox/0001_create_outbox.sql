-- The outbox table on SQLite. Timestamps are TEXT in one fixed format,
-- UTC with milliseconds ('2006-01-02T15:04:05.000Z'), always produced by
-- strftime('%Y-%m-%dT%H:%M:%fZ', ...) in SQL or the same layout in Go, so
-- that comparing the text compares the times. JSON is TEXT.
--
-- claimed_until is SQLite's claim: a lease stamped by one short write, so
-- that no write transaction stays open while a batch is published.
--
-- No unique index on event_id, for the same reason as on PostgreSQL.
CREATE TABLE IF NOT EXISTS {{table}} (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id        TEXT    NOT NULL,
    aggregate_type  TEXT    NOT NULL DEFAULT '',
    aggregate_id    TEXT    NOT NULL DEFAULT '',
    event_type      TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    headers         TEXT    NOT NULL DEFAULT '{}',
    created_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    published_at    TEXT,
    attempt_count   INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    dead_at         TEXT,
    claimed_until   TEXT
);

CREATE INDEX IF NOT EXISTS {{schema_prefix}}{{index "claim"}} ON {{table_name}} (next_attempt_at, id)
    WHERE published_at IS NULL AND dead_at IS NULL;

CREATE INDEX IF NOT EXISTS {{schema_prefix}}{{index "published"}} ON {{table_name}} (published_at)
    WHERE published_at IS NOT NULL;

CREATE INDEX IF NOT EXISTS {{schema_prefix}}{{index "dead"}} ON {{table_name}} (dead_at, id)
    WHERE dead_at IS NOT NULL;
