package sqlfixture

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// connect opens one connection to dsn, closed when the test ends.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func exec(t *testing.T, conn *pgx.Conn, sqls ...string) {
	t.Helper()
	for _, q := range sqls {
		if _, err := conn.Exec(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// scan returns the one value q selects.
func scan[T any](t *testing.T, conn *pgx.Conn, q string, args ...any) T {
	t.Helper()
	var v T
	if err := conn.QueryRow(t.Context(), q, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return v
}

// A test's database, with everything a test may leave in it (tables and
// a schema of its own, a function, a type, a publication and a logical
// slot, an event trigger, an extension, a large object, a setting, and a
// client still connected), goes to the next test of the process renamed
// and as empty as a new one; the client left behind finds it gone.
func TestDatabaseReusedEmpty(t *testing.T) {
	t.Parallel()
	dsn, _ := adminDB(t)
	d := &dropper{adminDSN: dsn}
	fresh := connect(t, d.create(t)) // a new database, to compare with
	var first string
	var leaked *pgx.Conn
	t.Run("first", func(t *testing.T) {
		db := d.create(t)
		first = dsnDatabase(t, db)
		conn := connect(t, db)
		exec(t, conn,
			"CREATE TABLE outbox_events (id bigserial PRIMARY KEY, payload jsonb)",
			"INSERT INTO outbox_events (payload) VALUES ('{}')",
			"CREATE SCHEMA app",
			"CREATE TABLE app.orders (id int)",
			"CREATE TYPE mood AS ENUM ('ok', 'not')",
			"CREATE FUNCTION app.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
			"CREATE PUBLICATION pub FOR TABLE outbox_events",
			"SELECT pg_create_logical_replication_slot('reuse_"+randomID()+"', 'pgoutput')",
			"CREATE FUNCTION on_ddl() RETURNS event_trigger LANGUAGE plpgsql AS 'BEGIN END'",
			"CREATE EVENT TRIGGER ddl ON ddl_command_end EXECUTE FUNCTION on_ddl()",
			"CREATE EXTENSION pgcrypto",
			"SELECT lo_create(0)",
			"ALTER DATABASE "+first+" SET work_mem = '7MB'",
			"CREATE TEMP TABLE scratch (id int)",
		)
		// A client the test leaves behind: not closed when it ends.
		var err error
		if leaked, err = pgx.Connect(context.Background(), db); err != nil {
			t.Fatal(err)
		}
	})
	defer leaked.Close(context.Background())
	kept := d.kept()
	if len(kept) != 1 {
		t.Fatalf("%d databases kept for reuse after the first test, want its own, reset", len(kept))
	}

	t.Run("second", func(t *testing.T) {
		db := d.create(t)
		conn := connect(t, db)
		if second := dsnDatabase(t, db); second != kept[0] || second == first {
			t.Fatalf("the second test got %s after %s: want the first's database under its new name, %s", second, first, kept[0])
		}
		for what, q := range map[string]string{
			"tables":         "SELECT count(*) FROM pg_class WHERE relname IN ('outbox_events', 'orders', 'scratch')",
			"schemas":        "SELECT count(*) FROM pg_namespace WHERE nspname = 'app'",
			"types":          "SELECT count(*) FROM pg_type WHERE typname = 'mood'",
			"functions":      "SELECT count(*) FROM pg_proc WHERE proname IN ('f', 'on_ddl')",
			"publications":   "SELECT count(*) FROM pg_publication",
			"slots":          "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()",
			"event triggers": "SELECT count(*) FROM pg_event_trigger",
			"extensions":     "SELECT count(*) FROM pg_extension WHERE extname = 'pgcrypto'",
			"large objects":  "SELECT count(*) FROM pg_largeobject_metadata",
			"settings":       "SELECT count(*) FROM pg_db_role_setting WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())",
		} {
			if n := scan[int64](t, conn, q); n != 0 {
				t.Errorf("the reused database holds %d of the first test's %s", n, what)
			}
		}
		if got := scan[string](t, conn, "SELECT current_setting('work_mem')"); got != scan[string](t, fresh, "SELECT current_setting('work_mem')") {
			t.Errorf("work_mem %s in the reused database, the first test's setting", got)
		}
		// The public schema as initdb makes it: owner, grants, comment.
		const public = "SELECT nspowner::regrole::text || ' ' || nspacl::text || ' ' || obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = 'public'"
		if got, want := scan[string](t, conn, public), scan[string](t, fresh, public); got != want {
			t.Errorf("public schema %q, want %q as in a new database", got, want)
		}
		if err := leaked.Ping(t.Context()); err == nil {
			t.Error("the first test's client still reaches the database the second test uses")
		}
		u, _ := url.Parse(dsn)
		u.Path = "/" + first
		if c, err := pgx.Connect(t.Context(), u.String()); err == nil {
			c.Close(context.Background())
			t.Errorf("%s, the first test's name, still takes connections", first)
		}
	})
}

// A database whose reset cannot undo what its test did (here a connection
// limit) is dropped, not handed to the next test.
func TestUnresettableDatabaseDropped(t *testing.T) {
	t.Parallel()
	dsn, admin := adminDB(t)
	d := &dropper{adminDSN: dsn}
	databases := func() []string {
		rows, err := admin.Query("SELECT datname FROM pg_database")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var names []string
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			names = append(names, n)
		}
		return names
	}
	before := databases()
	var name string
	t.Run("limited", func(t *testing.T) {
		name = dsnDatabase(t, d.create(t))
		if _, err := admin.Exec("ALTER DATABASE " + name + " CONNECTION LIMIT 50"); err != nil {
			t.Fatal(err)
		}
	})
	kept := len(d.kept())
	d.mu.Lock()
	// But those the first create swept: stale ones, which another test
	// (TestStaleDatabasesSwept) may make at any moment beside this one.
	var queued []string
	for _, n := range d.pending {
		at, ok := created(n)
		if !slices.Contains(before, n) && !(ok && time.Since(at) > staleAfter) {
			queued = append(queued, n)
		}
	}
	d.mu.Unlock()
	if kept != 0 || len(queued) != 1 {
		t.Fatalf("%d databases kept for reuse and %v queued for a drop; want none kept and %s's queued: its connection limit is still set", kept, queued, name)
	}
	// The reset's error names what it left.
	db := d.create(t)
	conn := connect(t, db)
	if _, err := admin.Exec("ALTER DATABASE " + dsnDatabase(t, db) + " CONNECTION LIMIT 50"); err != nil {
		t.Fatal(err)
	}
	if err := leftovers(t.Context(), conn); !errors.Is(err, errLeftovers) || !strings.Contains(err.Error(), "connection limit") {
		t.Errorf("leftovers = %v, want errLeftovers naming the connection limit", err)
	}
	wait.ForStall(t, queued[0]+" (the test's database, renamed) dropped", dropDelay+wait.Stall, func() (bool, any) { return !exists(t, admin, queued[0]), nil })
}

// A free database whose expiry fired while a test was taking one is not
// taken, and its expiry still queues it for a drop: neither handed out
// nor lost.
func TestExpiredDatabaseStillDropped(t *testing.T) {
	t.Parallel()
	dsn, _ := adminDB(t)
	d := &dropper{adminDSN: dsn}
	name := newDatabaseName(time.Now()) // never made: its drop is IF EXISTS
	timers := make(chan *time.Timer, 1)
	fired := make(chan struct{})
	d.mu.Lock()
	timer := time.AfterFunc(0, func() {
		close(fired)
		d.expire(name, <-timers) // waits for the lock the test holds
	})
	timers <- timer
	d.free = map[string]*time.Timer{name: timer}
	<-fired
	got, ok := d.takeLocked()
	d.mu.Unlock()
	if ok {
		t.Fatalf("took %s, whose expiry had fired", got)
	}
	wait.Until(t, name+", expired while a test took a database, queued for a drop", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return slices.Contains(d.pending, name)
	})
}
