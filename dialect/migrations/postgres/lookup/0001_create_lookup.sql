-- Opt-in (MigrateOptions.LookupIndexes, txoutbox migrate --lookup-indexes):
-- indexes for operators who look events up by ID and list an aggregate's
-- events often (the console's events page). Every producer's insert then
-- writes two more index entries, which is why they are not in the default
-- migrations.
CREATE INDEX IF NOT EXISTS {{index "event_id"}} ON {{table}} (event_id);
CREATE INDEX IF NOT EXISTS {{index "aggregate"}} ON {{table}} (aggregate_id, id);
