-- The consumer-side inbox on SQLite (timestamps as in the outbox table).
CREATE TABLE IF NOT EXISTS {{table}} (
    consumer     TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    PRIMARY KEY (consumer, event_id)
);

CREATE INDEX IF NOT EXISTS {{schema_prefix}}{{index "processed_at"}} ON {{table_name}} (processed_at);
