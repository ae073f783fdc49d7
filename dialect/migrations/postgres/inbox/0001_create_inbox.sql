-- The consumer-side inbox: one row per (consumer, event) processed.
CREATE TABLE IF NOT EXISTS {{table}} (
    consumer     TEXT        NOT NULL,
    event_id     TEXT        NOT NULL,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- Retention of inbox records.
CREATE INDEX IF NOT EXISTS {{index "processed_at"}} ON {{table}} (processed_at);
