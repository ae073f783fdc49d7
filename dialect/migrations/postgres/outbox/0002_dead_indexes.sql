-- Dead letters are listed in Seq order (txoutbox dead list, the console):
-- with only the (dead_at, id) index the planner walked the primary key from
-- the start, through every published row kept, to find the dead ones (2.4 s
-- with 5M published rows). This index holds the dead rows only.
CREATE INDEX IF NOT EXISTS {{index "dead_seq"}} ON {{table}} (id)
    WHERE dead_at IS NOT NULL;

-- Stats counts the dead rows by type from this index alone (an index-only
-- scan); reading them from the table made the planner scan the whole table
-- once they were a few percent of it.
CREATE INDEX IF NOT EXISTS {{index "dead_type"}} ON {{table}} (event_type)
    WHERE dead_at IS NOT NULL;
