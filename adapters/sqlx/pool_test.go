package sqlxoutbox_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/logbuf"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// Eight goroutines in transactions on a pool that keeps database/sql's two
// idle connections: the pool closes connection after connection, and Stats
// says so, once, with the fix. With as many idle as open, it says nothing.
// The warning needs Churn closes a second between two Stats calls: on a
// machine loaded by other tests one round of transactions may close fewer,
// so the rounds go on (up to a minute) until one does, each followed by
// Stats; the pool with idle slots runs as many rounds.
func TestStatsWarnsOfAChurningPool(t *testing.T) {
	t.Parallel()
	rounds := 0
	for _, idle := range []int{2, testenv.MaxOpenConns} {
		db := testenv.OpenPostgres(t)
		// 2 is database/sql's default, the trap (the test pools keep
		// MaxOpenConns idle: sqlfixture.SizePool).
		db.SetMaxIdleConns(idle)
		ctx := context.Background()
		if err := dialect.Migrate(ctx, db, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: quiet}); err != nil {
			t.Fatal(err)
		}
		var out logbuf.Buffer
		ob, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Logger: slog.New(slog.NewTextHandler(&out, nil))})
		if err != nil {
			t.Fatal(err)
		}
		churn := func() {
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for range 50 {
						tx, err := db.BeginTx(ctx, nil)
						if err != nil {
							t.Error(err)
							return
						}
						_, _ = tx.ExecContext(ctx, "SELECT 1")
						_ = tx.Commit()
						// The producer's own work between transactions:
						// its connection goes back to the pool, which has
						// no idle slot for it.
						time.Sleep(2 * time.Millisecond)
					}
				})
			}
			wg.Wait()
		}
		stats := func() {
			if _, err := ob.Stats(ctx); err != nil {
				t.Fatal(err)
			}
		}
		stats()
		if idle == 2 {
			rounds = 0
			for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && strings.Count(out.String(), "SetMaxIdleConns") == 0; rounds++ {
				churn()
				stats()
			}
			churn()
			stats()
		} else {
			for range rounds + 1 {
				churn()
				stats()
			}
		}
		closed := db.Stats().MaxIdleClosed
		warnings := strings.Count(out.String(), "SetMaxIdleConns")
		switch {
		case idle == 2 && warnings != 1:
			t.Errorf("default idle pool, %d connections closed for want of an idle slot: %d warnings, want 1:\n%s", closed, warnings, out.String())
		case idle > 2 && warnings != 0:
			t.Errorf("MaxIdleConns %d: %d warnings, want none:\n%s", idle, warnings, out.String())
		}
		t.Logf("MaxIdleConns %d: %d connections closed for want of an idle slot in %d rounds", max(idle, 2), closed, rounds+1)
	}
}
