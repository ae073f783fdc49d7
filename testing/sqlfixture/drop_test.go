package sqlfixture

import (
	"context"
	"database/sql"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

func adminDB(t *testing.T) (string, *sql.DB) {
	t.Helper()
	dsn := os.Getenv("TXOUTBOX_PG_DSN")
	if dsn == "" {
		t.Fatal("TXOUTBOX_PG_DSN is not set: start the services (scripts/services.sh start) and source .services/env")
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return dsn, db
}

func exists(t *testing.T, db *sql.DB, name string) bool {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// The databases of a test that ends are kept for reuse a while, then
// dropped together, in one batch.
func TestDatabasesDroppedInABatch(t *testing.T) {
	t.Parallel()
	dsn, admin := adminDB(t)
	d := &dropper{adminDSN: dsn} // this test's own, so no other test takes them
	t.Run("three", func(t *testing.T) {
		for range 3 {
			name := dsnDatabase(t, d.create(t))
			if _, ok := created(name); !ok {
				t.Fatalf("%s: a database name not of the dropper's form", name)
			}
		}
	})
	names := d.kept()
	if len(names) != 3 {
		t.Fatalf("%d databases kept for reuse after 3 tests ended, want 3", len(names))
	}
	for _, name := range names {
		if !exists(t, admin, name) {
			t.Fatalf("%s was dropped as its test ended, not kept for reuse", name)
		}
	}
	for _, name := range names {
		// Nothing is dropped before reuseWithin + dropDelay.
		wait.ForStall(t, name+" dropped after its test ended", reuseWithin+dropDelay+wait.Stall, func() (bool, any) { return !exists(t, admin, name), nil })
	}
}

// A database that no process dropped is dropped by the next process's
// first CreatePostgresDatabase once it is older than staleAfter, and a
// younger one is left to its own process.
func TestStaleDatabasesSwept(t *testing.T) {
	t.Parallel()
	dsn, admin := adminDB(t)
	stale, young := newDatabaseName(time.Now().Add(-staleAfter-time.Minute)), newDatabaseName(time.Now())
	for _, name := range []string{stale, young} {
		if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
			t.Fatal(err)
		}
	}
	d := &dropper{adminDSN: dsn} // a process that has not swept yet
	t.Cleanup(func() { _ = d.dropAll([]string{stale, young}) })
	d.sweep(context.Background())
	wait.ForStall(t, "the stale "+stale+" swept", dropDelay+wait.Stall, func() (bool, any) { return !exists(t, admin, stale), nil })
	if !exists(t, admin, young) {
		t.Errorf("the sweep dropped %s, a database of a process that may still run", young)
	}
}

func TestDatabaseNameCarriesItsCreation(t *testing.T) {
	at := time.Unix(1_796_572_003, 0)
	name := newDatabaseName(at)
	got, ok := created(name)
	if !ok || !got.Equal(at) {
		t.Fatalf("created(%q) = %v, %v; want %v, true", name, got, ok, at)
	}
	for _, other := range []string{"t_0a1b2c3d4e5f", "postgres", "t_zz_0a1b2c3d4e5f"} {
		if _, ok := created(other); ok {
			t.Errorf("created(%q) is true: a database not of the dropper's form", other)
		}
	}
}

func dsnDatabase(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}
