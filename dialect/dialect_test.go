package dialect_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

func TestValidateIdentifier(t *testing.T) {
	t.Parallel()
	good := []string{"outbox_events", "_x", "A1", "app.outbox", strings.Repeat("a", 63), strings.Repeat("s", 63) + "." + strings.Repeat("t", 63)}
	for _, s := range good {
		id, err := dialect.ValidateIdentifier(s)
		if err != nil {
			t.Errorf("ValidateIdentifier(%q) = %v, want ok", s, err)
		} else if id.String() != s {
			t.Errorf("ValidateIdentifier(%q).String() = %q", s, id.String())
		}
	}
	bad := []string{
		"", "1abc", "outbox events", "outbox;DROP TABLE users", `outbox"`, "outbox--", "a.b.c", ".a", "a.",
		strings.Repeat("a", 64), "outbox/*x*/", "outbox\x00", "ünïcode", "a-b", "t'; --",
		`outbox_events" (id int); DROP TABLE x; --`,
	}
	for _, s := range bad {
		if _, err := dialect.ValidateIdentifier(s); !errors.Is(err, dialect.ErrInvalidIdentifier) {
			t.Errorf("ValidateIdentifier(%q) = %v, want ErrInvalidIdentifier", s, err)
		}
	}
}

// Every entry point that takes a table name refuses injection attempts before
// any SQL is built or run.
func TestInjectionRejectedEverywhere(t *testing.T) {
	t.Parallel()
	const evil = "outbox_events; DROP TABLE orders; --"
	for _, d := range []dialect.Dialect{dialect.Postgres, dialect.MySQL, dialect.SQLite} {
		if _, err := d.Queries(evil); !errors.Is(err, dialect.ErrInvalidIdentifier) {
			t.Errorf("%s Queries: %v", d, err)
		}
		if _, err := d.InboxQueries(evil); !errors.Is(err, dialect.ErrInvalidIdentifier) {
			t.Errorf("%s InboxQueries: %v", d, err)
		}
		if _, err := dialect.Migrations(d, dialect.MigrateOptions{InboxTable: evil}); !errors.Is(err, dialect.ErrInvalidIdentifier) {
			t.Errorf("%s Migrations: %v", d, err)
		}
		// Migrate rejects before it touches the database: a nil *sql.DB
		// would panic otherwise.
		if err := dialect.Migrate(context.Background(), nil, d, dialect.MigrateOptions{Table: evil}); !errors.Is(err, dialect.ErrInvalidIdentifier) {
			t.Errorf("%s Migrate: %v", d, err)
		}
		if err := dialect.Migrate(context.Background(), nil, d, dialect.MigrateOptions{MigrationsTable: evil}); err == nil {
			t.Errorf("%s Migrate accepted migrations table %q", d, evil)
		}
	}
}

func TestByName(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]dialect.Dialect{"pgx": dialect.Postgres, "postgres": dialect.Postgres, "sqlite": dialect.SQLite, "sqlite3": dialect.SQLite,
		"mysql": dialect.MySQL, "MariaDB": dialect.MySQL} {
		if got, err := dialect.ByName(name); err != nil || got != want {
			t.Errorf("ByName(%q) = %v, %v", name, got, err)
		}
	}
	if _, err := dialect.ByName("oracle"); !errors.Is(err, dialect.ErrUnknownDialect) {
		t.Errorf("ByName(oracle) = %v", err)
	}
	if _, err := (dialect.Dialect{}).Queries(""); !errors.Is(err, dialect.ErrUnknownDialect) {
		t.Errorf("zero dialect Queries = %v", err)
	}
}

func TestPlaceholders(t *testing.T) {
	t.Parallel()
	evs := []core.Event{{ID: "0190c1d2-0000-7000-8000-000000000001", EventType: "a", Payload: []byte(`{}`)}, {ID: "0190c1d2-0000-7000-8000-000000000002", EventType: "b", Payload: []byte(`{}`)}}
	for _, tc := range []struct {
		d          dialect.Dialect
		want, deny string
	}{
		{dialect.Postgres, "$12", "?"},
		{dialect.Postgres.WithPlaceholders(dialect.Question), "?", "$1"},
		{dialect.SQLite, "?", "$1"},
		{dialect.MySQL, "?", "$1"},
	} {
		q, err := tc.d.Queries("app.events")
		if err != nil {
			t.Fatal(err)
		}
		ins, args, err := q.Insert(evs)
		if err != nil {
			t.Fatal(err)
		}
		if len(args) != 12 || !strings.Contains(ins, tc.want) || strings.Contains(ins, tc.deny) {
			t.Errorf("%v: Insert = %q with %d args", tc.d.Placeholders(), ins, len(args))
		}
		quoted := `"app"."events"`
		if tc.d == dialect.MySQL {
			quoted = "`app`.`events`"
		}
		if !strings.Contains(ins, quoted) {
			t.Errorf("table not quoted and qualified: %q", ins)
		}
		mf, _, err := q.MarkFailed([]core.Failure{{Seq: 1, Err: "x"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{ins, mf} {
			if strings.Contains(s, tc.deny) {
				t.Errorf("%q has %q", s, tc.deny)
			}
		}
	}
}

func TestFiltersRefuseEmpty(t *testing.T) {
	t.Parallel()
	q, err := dialect.Postgres.Queries("")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := q.RetryDead(dialect.DeadFilter{}); !errors.Is(err, dialect.ErrInvalidFilter) {
		t.Errorf("RetryDead(empty) = %v", err)
	}
	if _, _, err := q.PurgeDead(dialect.DeadFilter{}); !errors.Is(err, dialect.ErrInvalidFilter) {
		t.Errorf("PurgeDead(empty) = %v", err)
	}
	if _, _, err := q.Replay(dialect.ReplayFilter{}); !errors.Is(err, dialect.ErrInvalidFilter) {
		t.Errorf("Replay(empty) = %v", err)
	}
	if _, _, err := q.Replay(dialect.ReplayFilter{FromSeq: 5, ToSeq: 2}); !errors.Is(err, dialect.ErrInvalidFilter) {
		t.Errorf("Replay(5..2) = %v", err)
	}
	if _, _, err := q.RetryDead(dialect.DeadFilter{EventIDs: []string{"'; DROP TABLE x; --"}}); !errors.Is(err, dialect.ErrInvalidFilter) {
		t.Errorf("RetryDead(bad id) = %v", err)
	}
	if _, _, err := q.GetByEventID("nope"); !errors.Is(err, dialect.ErrInvalidFilter) {
		t.Errorf("GetByEventID(nope) = %v", err)
	}
	if _, _, err := q.RetryDead(dialect.DeadFilter{All: true}); err != nil {
		t.Errorf("RetryDead(All) = %v", err)
	}
}

func openSQLite(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

type migrateCase struct {
	name string
	d    dialect.Dialect
	open func(t *testing.T) (open func() *sql.DB)
	// prepare creates what custom names need (a schema).
	prepare string
	opts    dialect.MigrateOptions
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func migrateCases() []migrateCase {
	pg := func(t *testing.T) func() *sql.DB {
		dsn := testenv.PostgresDSN(t)
		return func() *sql.DB {
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		}
	}
	lite := func(t *testing.T) func() *sql.DB {
		path := filepath.Join(t.TempDir(), "m.db")
		// Switching a new file to WAL needs it to itself (and does not
		// wait on busy_timeout), so do it once, as a deployment does.
		if err := openSQLite(t, path).Ping(); err != nil {
			t.Fatal(err)
		}
		return func() *sql.DB { return openSQLite(t, path) }
	}
	my := func(t *testing.T) func() *sql.DB {
		dsn := testenv.MySQLDSN(t)
		return func() *sql.DB {
			db, err := sql.Open("mysql", dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		}
	}
	return []migrateCase{
		{name: "postgres", d: dialect.Postgres, open: pg, opts: dialect.MigrateOptions{Logger: quiet}},
		{name: "mariadb", d: dialect.MySQL, open: my, opts: dialect.MigrateOptions{Logger: quiet}},
		{name: "mariadb_custom", d: dialect.MySQL, open: my,
			opts: dialect.MigrateOptions{Table: "Order_Outbox", InboxTable: "inbox", MigrationsTable: "schema_versions", Logger: quiet}},
		{name: "postgres_custom", d: dialect.Postgres, open: pg, prepare: "CREATE SCHEMA app",
			opts: dialect.MigrateOptions{Table: "app.Order_Outbox", InboxTable: "app.inbox", MigrationsTable: "app.schema_versions", Logger: quiet}},
		{name: "sqlite", d: dialect.SQLite, open: lite, opts: dialect.MigrateOptions{Logger: quiet}},
		{name: "sqlite_custom", d: dialect.SQLite, open: lite,
			opts: dialect.MigrateOptions{Table: "main.order", InboxTable: "seen", Logger: quiet}},
	}
}

func TestMigrateIdempotent(t *testing.T) {
	t.Parallel()
	for _, tc := range migrateCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := tc.open(t)()
			if tc.prepare != "" {
				if _, err := db.ExecContext(ctx, tc.prepare); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 3 {
				if err := dialect.Migrate(ctx, db, tc.d, tc.opts); err != nil {
					t.Fatalf("Migrate #%d: %v", i+1, err)
				}
			}
			assertMigrated(t, db, tc.d, tc.opts)
		})
	}
}

func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	for _, tc := range migrateCases() {
		if tc.prepare != "" {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			open := tc.open(t)
			const n = 4
			dbs := make([]*sql.DB, n)
			for i := range dbs {
				dbs[i] = open() // one pool each, as separate processes would have
			}
			var wg sync.WaitGroup
			errs := make([]error, n)
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					errs[i] = dialect.Migrate(context.Background(), dbs[i], tc.d, tc.opts)
				})
			}
			close(start)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("migrator %d: %v", i, err)
				}
			}
			assertMigrated(t, dbs[0], tc.d, tc.opts)
		})
	}
}

// assertMigrated checks that every migration is recorded exactly once and
// that the tables accept the rows the stores write.
func assertMigrated(t *testing.T, db *sql.DB, d dialect.Dialect, opts dialect.MigrateOptions) {
	t.Helper()
	ctx := context.Background()
	ms, err := dialect.Migrations(d, opts)
	if err != nil {
		t.Fatal(err)
	}
	mt := opts.MigrationsTable
	if mt == "" {
		mt = dialect.DefaultMigrationsTable
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+mt).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(ms) || n < 2 {
		t.Fatalf("%d migrations recorded, want %d", n, len(ms))
	}
	q, err := d.Queries(opts.Table)
	if err != nil {
		t.Fatal(err)
	}
	ins, args, err := q.Insert([]core.Event{{ID: "0190c1d2-0000-7000-8000-000000000001", EventType: "t", Payload: []byte(`{"a":1}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, ins, args...); err != nil {
		t.Fatalf("insert into migrated table: %v", err)
	}
	iq, err := d.InboxQueries(opts.InboxTable)
	if err != nil {
		t.Fatal(err)
	}
	rec, rargs := iq.Record("c", "e1")
	for want := int64(1); want >= 0; want-- {
		res, err := db.ExecContext(ctx, rec, rargs...)
		if err != nil {
			t.Fatalf("inbox record: %v", err)
		}
		if got, _ := res.RowsAffected(); got != want {
			t.Fatalf("inbox record affected %d rows, want %d", got, want)
		}
	}
}

// A failing migration rolls back everything of its run and records nothing.
func TestMigrateFailureRollsBack(t *testing.T) {
	t.Parallel()
	for _, tc := range migrateCases() {
		if tc.opts.Table != "" || tc.d == dialect.MySQL { // MySQL: TestMigrateFailureMySQL
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := tc.open(t)()
			// A foreign table in the way: CREATE TABLE IF NOT EXISTS keeps
			// it, and the claim index on its missing columns fails.
			if _, err := db.ExecContext(ctx, "CREATE TABLE outbox_events (x INTEGER)"); err != nil {
				t.Fatal(err)
			}
			if err := dialect.Migrate(ctx, db, tc.d, tc.opts); err == nil {
				t.Fatal("Migrate over an incompatible table succeeded")
			}
			var n int
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM txoutbox_migrations").Scan(&n); err == nil {
				t.Errorf("migrations table exists with %d rows after a failed run", n)
			}
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM processed_events").Scan(&n); err == nil {
				t.Errorf("inbox table created by a failed run")
			}
			// The connection went back clean: the pool still works.
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM outbox_events").Scan(&n); err != nil {
				t.Errorf("pool unusable after failed migration: %v", err)
			}
		})
	}
}

// On MySQL, whose DDL commits as it runs, a failing migration is not
// recorded, the ones before it are, and a run after the cause is removed
// finishes the job.
func TestMigrateFailureMySQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.OpenMySQL(t)
	// A foreign table in the way: the ordered migration's indexes name
	// columns it lacks.
	if _, err := db.ExecContext(ctx, "CREATE TABLE outbox_events (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	if err := dialect.Migrate(ctx, db, dialect.MySQL, dialect.MigrateOptions{Logger: quiet}); err == nil {
		t.Fatal("Migrate over an incompatible table succeeded")
	}
	recorded := func() map[string]bool {
		rows, err := db.QueryContext(ctx, "SELECT component FROM txoutbox_migrations")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		got := map[string]bool{}
		for rows.Next() {
			var c string
			if err := rows.Scan(&c); err != nil {
				t.Fatal(err)
			}
			got[c] = true
		}
		return got
	}
	if got := recorded(); got[dialect.ComponentOrdered] || got[dialect.ComponentInbox] {
		t.Fatalf("recorded %v after the ordered migration failed", got)
	}
	if _, err := db.ExecContext(ctx, "DROP TABLE outbox_events"); err != nil {
		t.Fatal(err)
	}
	// The outbox migration is recorded as done: CREATE TABLE IF NOT EXISTS
	// met the foreign table. Forget it, as an operator fixing this would.
	if _, err := db.ExecContext(ctx, "DELETE FROM txoutbox_migrations"); err != nil {
		t.Fatal(err)
	}
	if err := dialect.Migrate(ctx, db, dialect.MySQL, dialect.MigrateOptions{Logger: quiet}); err != nil {
		t.Fatalf("Migrate after the fix: %v", err)
	}
	assertMigrated(t, db, dialect.MySQL, dialect.MigrateOptions{})
	// The lock (this database's: other tests migrate other databases of
	// the server meanwhile) is released: another session takes it at once.
	const lock = "CONCAT('txoutbox_migrate:', LEFT(SHA1(DATABASE()), 40))"
	var got int
	if err := db.QueryRowContext(ctx, "SELECT GET_LOCK("+lock+", 0) + RELEASE_LOCK("+lock+")").Scan(&got); err != nil || got != 2 {
		t.Errorf("migrate lock still held: %d, %v", got, err)
	}
}
