-- The outbox table on MySQL 8.0.13+ and MariaDB 10.6+ (InnoDB).
--
-- Timestamps are DATETIME(6) in UTC, written by UTC_TIMESTAMP(6) or as UTC
-- text, whatever the session's time zone. JSON is LONGTEXT: txoutbox
-- validates it before writing, and MySQL's JSON type would reformat it.
-- Text columns are utf8mb4 with a binary collation, so that comparisons are
-- byte-exact as on PostgreSQL; 255 characters hold the 255 bytes that
-- core.Limits allows.
--
-- InnoDB has no partial indexes. The claim's index leads with published_at
-- and dead_at: pending rows are its (NULL, NULL, ...) prefix, so the claim
-- seeks straight to them however many published rows retention keeps, and
-- cleanup walks the same index by published_at.
--
-- No unique index on event_id, for the same reason as on PostgreSQL.
CREATE TABLE IF NOT EXISTS {{table}} (
    id              BIGINT       NOT NULL AUTO_INCREMENT,
    event_id        CHAR(36)     CHARACTER SET ascii NOT NULL,
    aggregate_type  VARCHAR(255) NOT NULL DEFAULT '',
    aggregate_id    VARCHAR(255) NOT NULL DEFAULT '',
    event_type      VARCHAR(255) NOT NULL,
    payload         LONGTEXT     NOT NULL,
    headers         TEXT         NOT NULL DEFAULT ('{}'),
    created_at      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    published_at    DATETIME(6)  NULL,
    attempt_count   INT          NOT NULL DEFAULT 0,
    last_error      TEXT         NULL,
    next_attempt_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    dead_at         DATETIME(6)  NULL,
    PRIMARY KEY (id),
    INDEX {{index "claim"}} (published_at, dead_at, next_attempt_at, id),
    INDEX {{index "dead"}} (dead_at, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
