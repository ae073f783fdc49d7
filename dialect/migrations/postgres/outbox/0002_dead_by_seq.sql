-- Dead letters are listed in Seq order (txoutbox dead list, the console):
-- with only the (dead_at, id) index the planner walked the primary key from
-- the start, through every published row kept, to find the dead ones (2.4 s
-- with 5M published rows). This index holds the dead rows only.
CREATE INDEX IF NOT EXISTS {{index "dead_seq"}} ON {{table}} (id)
    WHERE dead_at IS NOT NULL;
