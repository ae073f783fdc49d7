package dialect_test

import (
	"context"
	"testing"

	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// TestMarkPublishedAsync checks on PostgreSQL that the statement marks the
// rows and turns synchronous_commit off for its own transaction only.
func TestMarkPublishedAsync(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.OpenPostgres(t)
	db.SetMaxOpenConns(1) // one session, so SHOW sees what the mark set
	if err := dialect.Migrate(ctx, db, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO outbox_events (event_id, event_type, payload) SELECT gen_random_uuid(), 'e', '{}' FROM generate_series(1, 3)"); err != nil {
		t.Fatal(err)
	}
	q, err := dialect.Postgres.Queries("")
	if err != nil {
		t.Fatal(err)
	}
	var before string
	if err := db.QueryRow("SHOW synchronous_commit").Scan(&before); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	query, args := q.MarkPublishedAsync([]int64{1, 3})
	res, err := tx.Exec(query, args...)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 2 {
		t.Errorf("marked %d rows, want 2", n)
	}
	var inTx string
	if err := tx.QueryRow("SHOW synchronous_commit").Scan(&inTx); err != nil || inTx != "off" {
		t.Errorf("synchronous_commit in the mark's transaction = %q (%v), want off", inTx, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var after string
	if err := db.QueryRow("SHOW synchronous_commit").Scan(&after); err != nil || after != before {
		t.Errorf("synchronous_commit after the commit = %q (%v), want the session's %q", after, err, before)
	}
	var published, attempts int
	if err := db.QueryRow("SELECT count(*) FILTER (WHERE published_at IS NOT NULL), sum(attempt_count) FROM outbox_events").Scan(&published, &attempts); err != nil || published != 2 || attempts != 2 {
		t.Errorf("published %d, attempts %d (%v), want 2 and 2", published, attempts, err)
	}
	sq, err := dialect.SQLite.Queries("")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := sq.MarkPublishedAsync([]int64{1})
	b, _ := sq.MarkPublished([]int64{1})
	if a != b {
		t.Errorf("SQLite: %q, want MarkPublished's %q", a, b)
	}
}
