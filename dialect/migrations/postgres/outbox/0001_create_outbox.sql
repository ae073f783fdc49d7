-- The outbox table. There is deliberately no unique index on event_id: every
-- producer transaction would pay for maintaining it (a random-ish UUID
-- B-tree, one more index write per event), and the event ID is already
-- unique by construction (UUIDv7) and deduplicated where it matters, in the
-- consumers' inbox. Looking events up by event_id is an operator's task.
CREATE TABLE IF NOT EXISTS {{table}} (
    id              BIGSERIAL PRIMARY KEY,
    event_id        UUID        NOT NULL,
    aggregate_type  TEXT        NOT NULL DEFAULT '',
    aggregate_id    TEXT        NOT NULL DEFAULT '',
    event_type      TEXT        NOT NULL,
    payload         JSONB       NOT NULL,
    headers         JSONB       NOT NULL DEFAULT '{}',
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at    TIMESTAMPTZ,
    attempt_count   INT         NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    dead_at         TIMESTAMPTZ
);

-- The claim reads only due rows: a partial index stays small however many
-- published rows are kept for retention.
CREATE INDEX IF NOT EXISTS {{index "claim"}} ON {{table}} (next_attempt_at, id)
    WHERE published_at IS NULL AND dead_at IS NULL;

-- Retention deletes the oldest published rows in bounded batches.
CREATE INDEX IF NOT EXISTS {{index "published"}} ON {{table}} (published_at)
    WHERE published_at IS NOT NULL;

-- Dead letters are listed and re-queued by operators.
CREATE INDEX IF NOT EXISTS {{index "dead"}} ON {{table}} (dead_at, id)
    WHERE dead_at IS NOT NULL;
