package sqlfixture

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A PostgreSQL test database is reset when its test ends and handed to the
// next test of the process that asks for one, instead of being dropped and
// created again. CREATE DATABASE copies the template's ~950 pages into the
// WAL (its WAL_LOG strategy, PostgreSQL 15): about 7.5 MB and a fifth of a
// second of server CPU per database, which every log-mode walsender then
// reads too, and a make test run made about 600 of them.
//
// The reset renames the database first, so a client of the test that ended
// (a goroutine or process it left behind) finds it gone, as after a drop,
// rather than meeting the next test's rows. It then empties it and checks
// that no object a test made is left: every catalog of the database holds
// only the template's objects (OIDs below firstNormalObjectID) but the
// public schema, made again. A database that fails any step is dropped
// instead, so a test always gets one as empty as a fresh one.

// firstNormalObjectID is the first OID PostgreSQL gives: objects made by
// initdb have lower OIDs, those of users (and of tests) this or higher.
const firstNormalObjectID = 16384

// reuseWithin is how long a reset database waits for a test to take it
// before it joins a drop batch: the gap between two tests of a package is
// shorter; a package whose tests are over frees the server of them soon.
const reuseWithin = dropDelay

// create returns the DSN of an empty database for t: a reset one if the
// process has one free, else a new one.
func (d *dropper) create(t testing.TB) string {
	t.Helper()
	name, ok := d.take()
	if !ok {
		db, err := d.adminDB()
		if err != nil {
			t.Fatalf("sqlfixture: open admin connection: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		d.sweep(ctx)
		name = newDatabaseName(time.Now())
		if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
			t.Fatalf("sqlfixture: create database %s on %s: %v", name, redact(d.adminDSN), err)
		}
	}
	t.Cleanup(func() { d.release(name) })
	dsn, err := d.databaseDSN(name)
	if err != nil {
		t.Fatalf("sqlfixture: parse %s: %v", redact(d.adminDSN), err)
	}
	return dsn
}

// databaseDSN is the admin DSN with its database replaced by name.
func (d *dropper) databaseDSN(name string) (string, error) {
	u, err := url.Parse(d.adminDSN)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

// kept returns the names of the reset databases waiting for a test.
func (d *dropper) kept() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Collect(maps.Keys(d.free))
}

// take returns a reset database of the process, if one is free.
func (d *dropper) take() (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.takeLocked()
}

// takeLocked is take with d.mu held. A database whose expiry fired already
// is left where it is: the expiry is waiting for the lock to queue it for
// a drop.
func (d *dropper) takeLocked() (string, bool) {
	for name, expiry := range d.free {
		if expiry.Stop() {
			delete(d.free, name)
			return name, true
		}
	}
	return "", false
}

// expire queues name for a drop if it is still free under expiry, the
// timer release kept with it.
func (d *dropper) expire(name string, expiry *time.Timer) {
	d.mu.Lock()
	free := d.free[name] == expiry
	if free {
		delete(d.free, name)
	}
	d.mu.Unlock()
	if free {
		d.drop(name)
	}
}

// release resets the database of a test that ended and keeps it for the
// next one, or queues it for a drop if it cannot be reset.
func (d *dropper) release(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fresh, err := d.reset(ctx, name)
	if err != nil {
		d.drop(fresh)
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.free == nil {
		d.free = map[string]*time.Timer{}
	}
	// The timer's function learns its own timer through a channel: the
	// variable is written after AfterFunc returns, and read outside d.mu.
	timers := make(chan *time.Timer, 1)
	expiry := time.AfterFunc(reuseWithin, func() { d.expire(fresh, <-timers) })
	timers <- expiry
	d.free[fresh] = expiry
}

// reset ends the sessions and replication slots of database name, renames
// it, and empties it. It returns the database's name at the end (name if
// the rename failed), which the caller drops on an error.
func (d *dropper) reset(ctx context.Context, name string) (string, error) {
	admin, err := d.adminDB()
	if err != nil {
		return name, err
	}
	fresh := newDatabaseName(time.Now())
	// Sessions first (a walsender holds its slot), then the slots, then the
	// rename, which refuses while any session is left: a terminated
	// session takes a moment to go, and a client may connect again.
	for try := 0; ; try++ {
		_, err := admin.ExecContext(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", name)
		if err == nil {
			_, err = admin.ExecContext(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1", name)
		}
		if err == nil {
			_, err = admin.ExecContext(ctx, "ALTER DATABASE "+name+" RENAME TO "+fresh)
		}
		if err == nil {
			break
		}
		if try == 20 {
			return name, err
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := admin.ExecContext(ctx, "ALTER DATABASE "+fresh+" RESET ALL"); err != nil {
		return fresh, err
	}
	dsn, err := d.databaseDSN(fresh)
	if err != nil {
		return fresh, err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fresh, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, emptyDatabase); err != nil {
		return fresh, fmt.Errorf("empty database %s: %w", fresh, err)
	}
	return fresh, leftovers(ctx, conn)
}

// emptyDatabase drops what tests make in a database: event triggers,
// publications, extensions, schemas, and the public schema's contents (by
// dropping it and making it again as initdb made it).
const emptyDatabase = `DO $$
DECLARE r record;
BEGIN
	FOR r IN SELECT evtname FROM pg_event_trigger LOOP
		EXECUTE format('DROP EVENT TRIGGER %I', r.evtname);
	END LOOP;
	FOR r IN SELECT pubname FROM pg_publication LOOP
		EXECUTE format('DROP PUBLICATION %I', r.pubname);
	END LOOP;
	FOR r IN SELECT extname FROM pg_extension WHERE oid >= 16384 LOOP
		EXECUTE format('DROP EXTENSION %I CASCADE', r.extname);
	END LOOP;
	FOR r IN SELECT nspname FROM pg_namespace WHERE oid >= 16384 AND nspname <> 'public' AND nspname !~ '^pg_' LOOP
		EXECUTE format('DROP SCHEMA %I CASCADE', r.nspname);
	END LOOP;
	FOR r IN SELECT oid FROM pg_largeobject_metadata LOOP
		PERFORM lo_unlink(r.oid);
	END LOOP;
END $$;
DROP SCHEMA public CASCADE;
CREATE SCHEMA public AUTHORIZATION pg_database_owner;
GRANT USAGE ON SCHEMA public TO PUBLIC;
COMMENT ON SCHEMA public IS 'standard public schema'`

// leftovers returns an error naming what conn's database holds that a
// fresh one does not: rows of its catalogs at or above
// firstNormalObjectID (but the public schema and the sessions' temporary
// schemas), settings, grants or a changed owner, connection limit or
// template flag, replication slots.
func leftovers(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, `SELECT c.relname FROM pg_class c
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'oid' AND NOT a.attisdropped
		WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'r' AND NOT c.relisshared
		ORDER BY c.relname`)
	if err != nil {
		return err
	}
	catalogs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	const temp = `(SELECT oid FROM pg_namespace WHERE nspname ~ '^pg_(toast_)?temp_')`
	var q strings.Builder
	for i, c := range catalogs {
		if i > 0 {
			q.WriteString(" UNION ALL ")
		}
		fmt.Fprintf(&q, "SELECT '%[1]s', count(*) FROM pg_catalog.%[1]s WHERE oid >= %[2]d", c, firstNormalObjectID)
		switch c {
		case "pg_namespace":
			q.WriteString(` AND nspname <> 'public' AND nspname !~ '^pg_(toast_)?temp_'`)
		case "pg_class":
			q.WriteString(" AND relnamespace NOT IN " + temp)
		case "pg_type":
			q.WriteString(" AND typnamespace NOT IN " + temp)
		}
	}
	q.WriteString(` UNION ALL SELECT 'database settings', count(*) FROM pg_db_role_setting
			WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
		UNION ALL SELECT 'replication slots', count(*) FROM pg_replication_slots WHERE database = current_database()
		UNION ALL SELECT 'grants, owner, connection limit or template flag', count(*) FROM pg_database
			WHERE datname = current_database() AND (datacl IS NOT NULL OR datdba <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
				OR datconnlimit <> -1 OR NOT datallowconn OR datistemplate)`)
	rows, err = conn.Query(ctx, q.String())
	if err != nil {
		return err
	}
	var left []string
	for rows.Next() {
		var what string
		var n int64
		if err := rows.Scan(&what, &n); err != nil {
			rows.Close()
			return err
		}
		if n > 0 {
			left = append(left, fmt.Sprintf("%s: %d", what, n))
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("%w: %s", errLeftovers, strings.Join(left, ", "))
	}
	return nil
}

// errLeftovers is a reset database that still holds what a test made.
var errLeftovers = errors.New("the reset left objects behind")
