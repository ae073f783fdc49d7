package dialect_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// One holder of a named lock at a time, on PostgreSQL directly, through
// PgBouncer in transaction pooling mode (where a session-level advisory
// lock would belong to whichever server connection ran the statement, and
// a second TryLock landing on it would take it again), and on MariaDB.
func TestTryLockOneHolder(t *testing.T) {
	t.Parallel()
	bouncer, direct := testenv.PgBouncerDSN(t, "default_query_exec_mode", "exec")
	for name, c := range map[string]struct {
		d    dialect.Dialect
		open func() *sql.DB
	}{
		"postgres":  {dialect.Postgres, func() *sql.DB { return testenv.OpenPostgresDSN(t, direct) }},
		"pgbouncer": {dialect.Postgres, func() *sql.DB { return testenv.OpenPostgresDSN(t, bouncer) }},
		"mariadb":   {dialect.MySQL, func() *sql.DB { return testenv.OpenMySQL(t) }},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			// Two processes' pools; the second runs several attempts, so
			// that one lands on the first's server connection if a
			// pooler hands it out.
			a, b := c.open(), c.open()
			if name == "mariadb" {
				b = a // GET_LOCK is per connection: one pool suffices
			}
			release, ok, err := c.d.TryLock(ctx, a, "archiver")
			if err != nil || !ok {
				t.Fatalf("first TryLock = %v, %v", ok, err)
			}
			for i := range 20 {
				r2, ok, err := c.d.TryLock(ctx, b, "archiver")
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					r2()
					t.Fatalf("attempt %d: a second holder took the lock", i)
				}
			}
			release()
			r3, ok, err := c.d.TryLock(ctx, b, "archiver")
			if err != nil || !ok {
				t.Fatalf("TryLock after release = %v, %v", ok, err)
			}
			r3()
		})
	}
}

type sqlStateError string

func (e sqlStateError) Error() string    { return "ERROR (SQLSTATE " + string(e) + ")" }
func (e sqlStateError) SQLState() string { return string(e) }

// A prepared statement lost or duplicated between pooled connections gets
// the fix in its error, not ErrNotMigrated.
func TestCheckMigratedNamesThePoolerFix(t *testing.T) {
	t.Parallel()
	table := dialect.Identifier{Name: "outbox_events"}
	for _, code := range []string{"42P05", "26000"} {
		err := dialect.CheckMigrated(sqlStateError(code), table)
		if !strings.Contains(err.Error(), "default_query_exec_mode=exec") || !dialect.IsPooledPreparedStatement(err) {
			t.Errorf("SQLSTATE %s: %v, want the pooler's fix", code, err)
		}
	}
	if err := dialect.CheckMigrated(sqlStateError("40001"), table); strings.Contains(err.Error(), "default_query_exec_mode") {
		t.Errorf("a serialization failure got the pooler's fix: %v", err)
	}
}
