package logrelay_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/logmode"
	"github.com/txoutbox/txoutbox/logrelay"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// A slot the server invalidated (max_slot_wal_keep_size) is said plainly:
// Status reports it, and the relay stops with ErrSlotInvalidated instead
// of streaming from a log with a hole in it. On a cluster of its own, whose
// limit the test may lower.
func TestInvalidatedSlotIsSaidPlainly(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	dsn := cl.NewDatabase(t)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := t.Context()
	if err := dialect.Migrate(ctx, db, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	names := logrelay.Names{Slot: "doomed"}
	if err := logrelay.Setup(ctx, dsn, names); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = logrelay.Teardown(context.Background(), dsn, names, logrelay.TeardownOptions{Force: true}) })
	box, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := core.NewEvent("order", "o-1", "order.created", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Enqueue(ctx, tx, ev); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// No relay reads the slot; the server may keep 1 MB for it, and three
	// WAL segments go by.
	for _, q := range []string{"ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE filler (x text)"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		for range 3 {
			if _, err := db.ExecContext(ctx, "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 100)"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, "SELECT pg_switch_wal()"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.ExecContext(ctx, "CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
		st, err := logrelay.Status(ctx, dsn, names)
		if err != nil {
			t.Fatal(err)
		}
		if st.Invalidated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never invalidated the slot: %+v", st)
		}
	}
	r, err := logrelay.New(box, outboxtest.NewRecorder(), logrelay.Options{ConnString: dsn, Names: names, Options: logmode.Options{Relay: core.RelayOptions{Logger: quiet}}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.Run(rctx); !errors.Is(err, logrelay.ErrSlotInvalidated) {
		t.Fatalf("Run on an invalidated slot: %v, want ErrSlotInvalidated", err)
	}
}
