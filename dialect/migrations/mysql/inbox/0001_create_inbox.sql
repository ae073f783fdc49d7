-- The consumer-side inbox on MySQL and MariaDB: one row per (consumer,
-- event) processed. Both are at most 255 characters (the inbox refuses
-- longer ones before writing).
CREATE TABLE IF NOT EXISTS {{table}} (
    consumer     VARCHAR(255) NOT NULL,
    event_id     VARCHAR(255) NOT NULL,
    processed_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer, event_id),
    INDEX {{index "processed_at"}} (processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
