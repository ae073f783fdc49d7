package dialect_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

func TestOrderedClaimPlaceholdersMatchArgs(t *testing.T) {
	for _, d := range []dialect.Dialect{dialect.Postgres, dialect.MySQL, dialect.SQLite} {
		q, err := d.Queries("app.events")
		if err != nil {
			t.Fatal(err)
		}
		for _, policy := range []core.DeadLetterPolicy{core.DeadLetterBlock, core.DeadLetterSkip} {
			query, args := q.ClaimOrdered(core.OrderedClaim{Partitions: []int{1, 5}, PartitionCount: 8, DeadLetter: policy}, 10, time.Minute)
			if n := countPlaceholders(d, query); n != len(args) {
				t.Errorf("%s/%s: %d placeholders, %d args: %s", d, policy, n, len(args), query)
			}
			if !strings.Contains(query, d.Quote(dialect.Identifier{Schema: "app", Name: "events"})) {
				t.Errorf("%s: claim does not name the qualified table: %s", d, query)
			}
			dead := strings.Contains(query, "dead_at IS NOT NULL OR")
			if dead != (policy == core.DeadLetterBlock) {
				t.Errorf("%s/%s: dead events block = %v: %s", d, policy, dead, query)
			}
		}
	}
	q, _ := dialect.Postgres.Queries("")
	query, args := q.LockPartitions([]int{3, 4})
	if countPlaceholders(dialect.Postgres, query) != len(args) || args[0] != "{3,4}" || args[1] != q.PartitionLockKey() {
		t.Errorf("LockPartitions = %s %v", query, args)
	}
	other, _ := dialect.Postgres.Queries("other_events")
	if q.PartitionLockKey() == other.PartitionLockKey() {
		t.Error("two tables share the partition lock key")
	}
	mq, _ := dialect.MySQL.Queries("app.events")
	query, args = mq.LockPartitions([]int{3, 4})
	if countPlaceholders(dialect.MySQL, query) != len(args) || args[1] != "3,4" || !strings.Contains(query, "`app`.`txoutbox_partition_locks`") {
		t.Errorf("MySQL LockPartitions = %s %v", query, args)
	}
	query, args = mq.CreatePartitionLocks(3)
	if countPlaceholders(dialect.MySQL, query) != len(args) || args[1] != "[0,1,2]" {
		t.Errorf("MySQL CreatePartitionLocks = %s %v", query, args)
	}
	if query, _ := q.CreatePartitionLocks(3); query != "" {
		t.Errorf("PostgreSQL CreatePartitionLocks = %q, want none", query)
	}
	sq, _ := dialect.SQLite.Queries("")
	if query, _ := sq.LockPartitions([]int{1}); query != "" {
		t.Errorf("SQLite LockPartitions = %q, want none", query)
	}
	if _, err := sq.Leases(); !errors.Is(err, core.ErrUnsupported) {
		t.Errorf("SQLite Leases: %v, want core.ErrUnsupported", err)
	}
	if _, _, err := sq.PartitionOf(1, 8); !errors.Is(err, core.ErrUnsupported) {
		t.Errorf("SQLite PartitionOf: %v, want core.ErrUnsupported", err)
	}
}

func TestLeaseQueriesPlaceholdersMatchArgs(t *testing.T) {
	for _, d := range []dialect.Dialect{dialect.Postgres, dialect.MySQL} {
		t.Run(d.Name(), func(t *testing.T) { checkLeaseQueries(t, d) })
	}
}

func checkLeaseQueries(t *testing.T, d dialect.Dialect) {
	q, _ := d.Queries("app.events")
	l, err := q.Leases()
	if err != nil {
		t.Fatal(err)
	}
	if l.Group() != "app.events" {
		t.Errorf("group %q, want app.events", l.Group())
	}
	if l.Returning() != (d == dialect.Postgres) {
		t.Errorf("Returning = %v on %s", l.Returning(), d)
	}
	schema := d.Quote(dialect.Identifier{Schema: "app", Name: "txoutbox_"})
	schema = schema[:len(schema)-1] // the table name is longer
	check := func(name, query string, args []any) {
		t.Helper()
		if n := countPlaceholders(d, query); n != len(args) {
			t.Errorf("%s: %d placeholders, %d args: %s", name, n, len(args), query)
		}
		if !strings.Contains(query, schema) {
			t.Errorf("%s: not in the outbox's schema: %s", name, query)
		}
		if d == dialect.MySQL && strings.Contains(query, " partition") {
			t.Errorf("%s: unquoted reserved word partition: %s", name, query)
		}
	}
	s, a := l.PartitionCount()
	check("PartitionCount", s, a)
	s, a = l.CreatePartitions(8)
	check("CreatePartitions", s, a)
	s, a = l.Heartbeat("me", time.Second)
	check("Heartbeat", s, a)
	s, a = l.LiveRelays()
	check("LiveRelays", s, a)
	s, a = l.PruneRelays(time.Minute)
	check("PruneRelays", s, a)
	s, a = l.Leave("me")
	check("Leave", s, a)
	s, a = l.Renew("me", time.Second)
	check("Renew", s, a)
	if s, a = l.Acquire("me", time.Second, 3); l.Returning() {
		check("Acquire", s, a)
	} else if s != "" {
		t.Errorf("Acquire without RETURNING = %q, want none", s)
	}
	s, a = l.Release("me", nil)
	check("Release all", s, a)
	s, a = l.Release("me", []int{1})
	check("Release some", s, a)
	s, a = l.List()
	check("List", s, a)
	s, a = l.Held("me")
	check("Held", s, a)
	s, a = l.AcquireCandidates(3)
	check("AcquireCandidates", s, a)
	s, a = l.AcquireMark("me", time.Second, []int{1, 2})
	check("AcquireMark", s, a)
}

// The default migrations include ordered mode's; SkipOrdered leaves them
// out.
func TestOrderedMigrationsRender(t *testing.T) {
	for _, d := range []dialect.Dialect{dialect.Postgres, dialect.MySQL, dialect.SQLite} {
		all, err := dialect.Migrations(d, dialect.MigrateOptions{Table: "app.events", SkipInbox: true})
		if err != nil {
			t.Fatal(err)
		}
		var ms []dialect.Migration
		for _, m := range all {
			if m.Component == dialect.ComponentOrdered {
				ms = append(ms, m)
			}
		}
		if len(ms) == 0 || ms[0].Table != "app.events" || ms[0].Version != 1 {
			t.Fatalf("%s: ordered migrations %+v among %d", d, ms, len(all))
		}
		if strings.Contains(ms[0].SQL, "{{") || !strings.Contains(ms[0].SQL, "events_ordered_due") {
			t.Errorf("%s: rendered SQL %s", d, ms[0].SQL)
		}
		skipped, err := dialect.Migrations(d, dialect.MigrateOptions{Table: "app.events", SkipInbox: true, SkipOrdered: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range skipped {
			if m.Component == dialect.ComponentOrdered {
				t.Errorf("%s: SkipOrdered still renders %s v%d", d, m.Component, m.Version)
			}
		}
	}
	if _, err := dialect.Migrations(dialect.Postgres, dialect.MigrateOptions{Table: "bad;name"}); !errors.Is(err, dialect.ErrInvalidIdentifier) {
		t.Errorf("bad table name: %v, want ErrInvalidIdentifier", err)
	}
}

func countPlaceholders(d dialect.Dialect, query string) int {
	if d.Placeholders() == dialect.Question {
		return strings.Count(query, "?")
	}
	n := 0
	for i := 1; strings.Contains(query, "$"+strconv.Itoa(i)); i++ {
		n = i
	}
	return n
}
