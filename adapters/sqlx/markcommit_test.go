package sqlxoutbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// TestMarkCommit runs a relay over an Outbox on PostgreSQL with its default
// asynchronous mark commit and with SyncMark: the claim statement sets
// synchronous_commit off for its own transaction only by default (seen in
// the statement of the open claim; the dialect tests check its effect), and
// both record the outcome alike.
func TestMarkCommit(t *testing.T) {
	t.Parallel()
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("SyncMark=%v", sync), func(t *testing.T) {
			t.Parallel()
			testMarkCommit(t, sync)
		})
	}
}

func testMarkCommit(t *testing.T, sync bool) {
	ctx := context.Background()
	db := sqlx.NewDb(testenv.OpenPostgres(t), "pgx")
	if err := dialect.Migrate(ctx, db.DB, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	box, err := sqlxoutbox.New(db, sqlxoutbox.Options{SyncMark: sync, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]core.Event, 5)
	for i := range evs {
		evs[i] = core.Event{EventType: "order.created", AggregateID: "o-1", Payload: []byte(`{}`)}
	}
	enqueueCommitted(t, ctx, db, box, evs...)
	fail := evs[2].ID
	pub := core.PublisherFunc(func(_ context.Context, batch []core.Event) error {
		be := core.NewBatchError(len(batch))
		for i := range batch {
			if batch[i].ID == fail {
				be.Errs[i] = context.DeadlineExceeded
			}
		}
		return be.ErrOrNil()
	})
	// The open claim's statement, as the server shows it.
	c, err := box.Claim(ctx, core.ClaimRequest{Limit: 10})
	if err != nil || len(c.Events()) != 5 {
		t.Fatalf("claim: %v", err)
	}
	var stmt string
	if err := db.GetContext(ctx, &stmt, "SELECT query FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'"); err != nil {
		t.Fatal(err)
	}
	if async := strings.Contains(stmt, "set_config('synchronous_commit', 'off', true)"); async == sync {
		t.Errorf("SyncMark %v, claim statement %q", sync, stmt)
	}
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	relay, err := core.NewRelay(box, pub, core.RelayOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	res, err := relay.ProcessBatch(ctx)
	if err != nil || res.Published != 4 || res.Failed != 1 {
		t.Fatalf("batch %+v, %v; want 4 published, 1 failed", res, err)
	}
	for _, ev := range evs {
		got, err := box.Get(ctx, ev.ID)
		if err != nil {
			t.Fatal(err)
		}
		if published := got.PublishedAt != nil; published == (ev.ID == fail) || got.AttemptCount != 1 {
			t.Errorf("event %s: published %v, attempts %d", ev.ID, got.PublishedAt, got.AttemptCount)
		}
	}
}
