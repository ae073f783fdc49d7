package sqlinbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
)

// TestSQLiteBeginImmediateWithoutBusyTimeout covers the DSN that takes the
// write lock at BEGIN (_txlock=immediate, as sqlxoutbox recommends for
// producers) but sets no busy_timeout: BEGIN itself is then refused with
// SQLITE_BUSY, and the inbox must wait and retry it rather than fail the
// delivery.
func TestSQLiteBeginImmediateWithoutBusyTimeout(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "inbox.db")+"?_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	fixtures.MigrateInbox(t, db, dialect.SQLite)
	if _, err := db.Exec(fixtures.EffectsDDL); err != nil {
		t.Fatal(err)
	}
	ib, err := sqlinbox.New(db, sqlinbox.Options{BusyTimeout: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const events, copies = 5, 3
	var wg sync.WaitGroup
	errs := make(chan error, events*copies)
	evIDs := make([]string, events)
	for i := range evIDs {
		evIDs[i] = uuid.NewString()
		for range copies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := ib.Process(ctx, "c1", evIDs[i], func(ctx context.Context) error {
					_, err := sqlinbox.Tx(ctx).ExecContext(ctx, `INSERT INTO effects (effect_key) VALUES (?)`, evIDs[i])
					time.Sleep(5 * time.Millisecond)
					return err
				})
				if err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Process: %v", err)
	}
	for _, id := range evIDs {
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM effects WHERE effect_key = ?`, id).Scan(&n); err != nil || n != 1 {
			t.Errorf("event %s took effect %d times (%v), want 1", id, n, err)
		}
	}
}
