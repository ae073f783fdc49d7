-- Ordered mode on SQLite (docs/ordering.md): one relay, no leases.

-- The ordered claim walks due events in Seq order.
CREATE INDEX IF NOT EXISTS {{schema_prefix}}{{index "ordered_due"}} ON {{table_name}} (id)
    WHERE published_at IS NULL AND dead_at IS NULL;

-- "Is an earlier event of this aggregate in backoff, dead or under another
-- claim's lease?"
CREATE INDEX IF NOT EXISTS {{schema_prefix}}{{index "ordered_pending"}} ON {{table_name}} (aggregate_id, id)
    WHERE published_at IS NULL;
