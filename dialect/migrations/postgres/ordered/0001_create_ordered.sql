-- Ordered mode (docs/ordering.md). Unordered relays need none of this.

-- The ordered claim walks due events in Seq order; the partial index keeps
-- that walk off the published rows kept for retention.
CREATE INDEX IF NOT EXISTS {{index "ordered_due"}} ON {{table}} (id)
    WHERE published_at IS NULL AND dead_at IS NULL;

-- "Is an earlier event of this aggregate in backoff or dead?" Only events
-- that failed at least once can be, so the index holds only those: it stays
-- small, and producers never write to it.
CREATE INDEX IF NOT EXISTS {{index "ordered_failed"}} ON {{table}} (aggregate_id, id)
    WHERE published_at IS NULL AND attempt_count > 0;

-- One row per partition of an outbox table (relay_group): which relay holds
-- it, until when. Rows are created by the first relay with the partition
-- count; takeovers lock rows FOR UPDATE SKIP LOCKED.
CREATE TABLE IF NOT EXISTS {{schema_prefix}}"txoutbox_leases" (
    relay_group TEXT        NOT NULL,
    partition   INTEGER     NOT NULL,
    owner       TEXT,
    expires_at  TIMESTAMPTZ NOT NULL DEFAULT '-infinity',
    acquired_at TIMESTAMPTZ,
    PRIMARY KEY (relay_group, partition)
);

-- The live relays of a group, by heartbeat, from which each computes its
-- fair share of partitions.
CREATE TABLE IF NOT EXISTS {{schema_prefix}}"txoutbox_relays" (
    relay_group TEXT        NOT NULL,
    owner       TEXT        NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (relay_group, owner)
);
