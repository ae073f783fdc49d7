-- Ordered mode on MySQL and MariaDB (docs/ordering.md, docs/mysql.md).

-- The ordered claim walks pending events in Seq order: (NULL, NULL, id)
-- is that walk, which stops at the claim's LIMIT. "Is an earlier event of
-- this aggregate in backoff or dead?" reads (aggregate_id, id). InnoDB has
-- no partial index, so both hold every row (PostgreSQL's hold only pending,
-- or failed, rows).
ALTER TABLE {{table}}
    ADD INDEX {{index "ordered_due"}} (published_at, dead_at, id),
    ADD INDEX {{index "ordered_agg"}} (aggregate_id, id);

-- One row per partition of an outbox table (relay_group): which relay holds
-- it, until when. Rows are created by the first relay with the partition
-- count; takeovers lock rows FOR UPDATE SKIP LOCKED.
CREATE TABLE IF NOT EXISTS {{schema_prefix}}`txoutbox_leases` (
    relay_group VARCHAR(255) NOT NULL,
    `partition` INT          NOT NULL,
    owner       VARCHAR(255) NULL,
    expires_at  DATETIME(6)  NOT NULL DEFAULT '1000-01-01 00:00:00',
    acquired_at DATETIME(6)  NULL,
    PRIMARY KEY (relay_group, `partition`)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The live relays of a group, by heartbeat.
CREATE TABLE IF NOT EXISTS {{schema_prefix}}`txoutbox_relays` (
    relay_group VARCHAR(255) NOT NULL,
    owner       VARCHAR(255) NOT NULL,
    expires_at  DATETIME(6)  NOT NULL,
    started_at  DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (relay_group, owner)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The fences of ordered claims: a claim locks the rows of the partitions it
-- serves for as long as its transaction lasts (pg_try_advisory_xact_lock
-- on PostgreSQL). Nothing else writes these rows once they exist.
CREATE TABLE IF NOT EXISTS {{schema_prefix}}`txoutbox_partition_locks` (
    relay_group VARCHAR(255) NOT NULL,
    `partition` INT          NOT NULL,
    PRIMARY KEY (relay_group, `partition`)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
