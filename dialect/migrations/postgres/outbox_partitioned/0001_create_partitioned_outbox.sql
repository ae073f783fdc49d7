-- The outbox table partitioned by day of created_at (see partitioned.go):
-- the same columns and partial indexes as the plain outbox, so that every
-- store runs its usual statements on it, but retention drops whole
-- partitions instead of deleting rows. The primary key must contain the
-- partition key; id alone stays unique in practice (one sequence).
CREATE TABLE IF NOT EXISTS {{table}} (
    id              BIGSERIAL,
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
    dead_at         TIMESTAMPTZ,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

-- Declared on the parent, each index is created on every partition.
CREATE INDEX IF NOT EXISTS {{index "claim"}} ON {{table}} (next_attempt_at, id)
    WHERE published_at IS NULL AND dead_at IS NULL;

CREATE INDEX IF NOT EXISTS {{index "published"}} ON {{table}} (published_at)
    WHERE published_at IS NOT NULL;

CREATE INDEX IF NOT EXISTS {{index "dead"}} ON {{table}} (dead_at, id)
    WHERE dead_at IS NOT NULL;

-- Catches rows no daily partition covers, so that a producer never fails
-- because maintenance fell behind. EnsurePartitions keeps it empty.
CREATE TABLE IF NOT EXISTS {{schema_prefix}}{{index "default"}} PARTITION OF {{table}} DEFAULT;
