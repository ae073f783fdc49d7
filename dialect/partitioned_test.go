package dialect_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

func partitionedDB(t *testing.T, opts dialect.PartitionOptions) *sql.DB {
	t.Helper()
	db := testenv.OpenPostgres(t)
	opts.Logger = quiet
	if err := dialect.MigratePartitioned(context.Background(), db, dialect.Postgres, opts); err != nil {
		t.Fatalf("MigratePartitioned: %v", err)
	}
	return db
}

func partitions(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.Query("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = CAST($1 AS regclass) ORDER BY 1", table)
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

func dayName(table string, daysFromToday int) string {
	return table + "_p" + time.Now().UTC().AddDate(0, 0, daysFromToday).Format("20060102")
}

// TestPartitionedOutboxConformance runs the store suite with the sqlx store
// on a partitioned table: every statement of the store works on it as on
// the plain table.
func TestPartitionedOutboxConformance(t *testing.T) {
	t.Parallel()
	outboxtest.RunStore(t, func(t *testing.T) *outboxtest.StoreFixture {
		// Backdate moves created_at back, which moves the row to an older
		// partition (here the DEFAULT one): PostgreSQL moves rows on UPDATE.
		return fixtures.SQLXPostgres(t, fixtures.Options{
			Logger:       quiet,
			OrdersColumn: "total",
			Partitioned:  &dialect.PartitionOptions{Ahead: 2},
		})
	})
}

func TestPartitionedMigrateAndEnsure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	opts := dialect.PartitionOptions{Table: "app_events", Ahead: 3, Logger: quiet}
	db := partitionedDB(t, opts)
	want := []string{"app_events_default", dayName("app_events", 0), dayName("app_events", 1), dayName("app_events", 2)}
	slices.Sort(want)
	if got := partitions(t, db, "app_events"); !slices.Equal(got, want) {
		t.Fatalf("partitions %v, want %v", got, want)
	}
	// Idempotent, and the next day adds exactly one.
	if err := dialect.MigratePartitioned(ctx, db, dialect.Postgres, opts); err != nil {
		t.Fatal(err)
	}
	created, err := dialect.EnsurePartitions(ctx, db, dialect.Postgres, opts, time.Now().AddDate(0, 0, 1))
	if err != nil || !slices.Equal(created, []string{dayName("app_events", 3)}) {
		t.Fatalf("EnsurePartitions tomorrow = %v, %v", created, err)
	}
	var versions int
	if err := db.QueryRow("SELECT count(*) FROM txoutbox_migrations WHERE component = $1 AND table_name = 'app_events'",
		dialect.ComponentOutboxPartitioned).Scan(&versions); err != nil || versions != 1 {
		t.Errorf("recorded versions %d, %v", versions, err)
	}

	// New events land in today's partition, not the DEFAULT one.
	box, err := sqlxoutbox.New(sqlx.NewDb(db, "pgx"), sqlxoutbox.Options{Table: "app_events", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	evs := []core.Event{{EventType: "order.created", Payload: []byte(`{}`)}}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Enqueue(ctx, tx, evs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var part string
	if err := db.QueryRow("SELECT tableoid::regclass::text FROM app_events WHERE id = $1", evs[0].Seq).Scan(&part); err != nil || part != dayName("app_events", 0) {
		t.Errorf("event stored in %q (%v), want %s", part, err, dayName("app_events", 0))
	}

	if _, err := dialect.PartitionedMigrations(dialect.SQLite, opts); !errors.Is(err, core.ErrUnsupported) {
		t.Errorf("SQLite: %v", err)
	}
	if _, err := dialect.PartitionedMigrations(dialect.Postgres, dialect.PartitionOptions{Table: "x; DROP TABLE y"}); !errors.Is(err, dialect.ErrInvalidIdentifier) {
		t.Errorf("bad table name: %v", err)
	}
}

// TestPartitionRetention checks that retention drops a whole partition only
// when every event in it was published before the cut-off, and that the
// maintainer does it as a core.Cleaner.
func TestPartitionRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	opts := dialect.PartitionOptions{Table: "outbox_events", Ahead: 2, Logger: quiet}
	db := partitionedDB(t, opts)
	// Partitions of ten to seven days ago, as if the outbox had run then.
	past := time.Now().AddDate(0, 0, -10)
	if _, err := dialect.EnsurePartitions(ctx, db, dialect.Postgres, dialect.PartitionOptions{Ahead: 4, Logger: quiet}, past); err != nil {
		t.Fatal(err)
	}
	insert := func(daysAgo int, published, dead string) {
		t.Helper()
		if _, err := db.Exec("INSERT INTO outbox_events (event_id, event_type, payload, created_at, published_at, dead_at)"+
			" VALUES (gen_random_uuid(), 'e', '{}', date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - $1 * interval '1 day' + interval '1 hour', "+published+", "+dead+")", daysAgo); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		insert(10, "now() - interval '9 days'", "NULL") // published long ago: droppable
	}
	insert(9, "now() - interval '8 days'", "NULL")
	insert(9, "NULL", "NULL")                      // pending: keeps its partition
	insert(8, "NULL", "now() - interval '8 days'") // dead: keeps its partition
	insert(7, "now()", "NULL")                     // published after the cut-off
	insert(0, "now() - interval '1 hour'", "NULL")

	before := time.Now().Add(-48 * time.Hour)
	res, err := dialect.DropPartitions(ctx, db, dialect.Postgres, opts, before)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Dropped, []string{dayName("outbox_events", -10)}) || res.Rows != 3 {
		t.Errorf("dropped %v (%d rows), want the partition of ten days ago (3 rows)", res.Dropped, res.Rows)
	}
	if want := []string{dayName("outbox_events", -9), dayName("outbox_events", -8), dayName("outbox_events", -7)}; !slices.Equal(res.Kept, want) {
		t.Errorf("kept %v, want %v", res.Kept, want)
	}
	var left int
	if err := db.QueryRow("SELECT count(*) FROM outbox_events").Scan(&left); err != nil || left != 5 {
		t.Errorf("%d events left (%v), want 5", left, err)
	}

	// Publish the pending one and purge the dead one: the maintainer, run
	// by core.Cleanup, then drops both partitions and keeps the one whose
	// event was published after the cut-off.
	box, err := sqlxoutbox.New(sqlx.NewDb(db, "pgx"), sqlxoutbox.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE outbox_events SET published_at = now() - interval '7 days' WHERE published_at IS NULL AND dead_at IS NULL"); err != nil {
		t.Fatal(err)
	}
	if n, err := box.PurgeDead(ctx, sqlxoutbox.DeadFilter{All: true}); err != nil || n != 1 {
		t.Fatalf("purge dead: %d, %v", n, err)
	}
	m, err := dialect.NewPartitionMaintainer(db, dialect.Postgres, opts)
	if err != nil {
		t.Fatal(err)
	}
	n, err := core.Cleanup(ctx, m, core.CleanupOptions{Retention: 48 * time.Hour, BatchSize: 1, Logger: quiet})
	if err != nil || n != 2 {
		t.Errorf("Cleanup through the maintainer dropped %d events (%v), want 2", n, err)
	}
	got := partitions(t, db, "outbox_events")
	for _, gone := range []string{dayName("outbox_events", -9), dayName("outbox_events", -8)} {
		if slices.Contains(got, gone) {
			t.Errorf("partition %s still there: %v", gone, got)
		}
	}
	for _, kept := range []string{"outbox_events_default", dayName("outbox_events", -7), dayName("outbox_events", 0), dayName("outbox_events", 1)} {
		if !slices.Contains(got, kept) {
			t.Errorf("partition %s gone: %v", kept, got)
		}
	}
}
