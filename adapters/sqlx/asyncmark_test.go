package sqlxoutbox_test

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testenv"
)

// TestAsyncMark runs a relay over an Outbox with AsyncMark on PostgreSQL:
// the marks take dialect.Queries.MarkPublishedAsync (whose effect on
// synchronous_commit the dialect tests check) and record the outcome as the
// plain mark does. On SQLite the option changes nothing.
func TestAsyncMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlx.NewDb(testenv.OpenPostgres(t), "pgx")
	if err := dialect.Migrate(ctx, db.DB, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	box, err := sqlxoutbox.New(db, sqlxoutbox.Options{AsyncMark: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]core.Event, 5)
	for i := range evs {
		evs[i] = core.Event{EventType: "order.created", AggregateID: "o-1", Payload: []byte(`{}`)}
	}
	if err := box.Enqueue(ctx, db, evs...); err != nil {
		t.Fatal(err)
	}
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
