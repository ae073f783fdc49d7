-- Opt-in (MigrateOptions.LookupIndexes, txoutbox migrate --lookup-indexes):
-- indexes for operators who look events up by ID and list an aggregate's
-- events often (the console's events page). Every producer's insert then
-- writes two more index entries, which is why they are not in the default
-- migrations. (With ordered mode's schema, (aggregate_id, id) exists
-- already as ordered_agg; InnoDB then keeps both.)
ALTER TABLE {{table}}
    ADD INDEX {{index "event_id"}} (event_id),
    ADD INDEX {{index "aggregate"}} (aggregate_id, id);
