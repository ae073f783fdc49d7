package sqlxoutbox

import (
	"context"
	"fmt"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// ListPublished returns at most limit events published before the given
// time, in Seq order, with their bookkeeping: the source of an archiver
// (package archive).
func (o *Outbox) ListPublished(ctx context.Context, before time.Time, limit int) ([]core.Event, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: list limit %d", core.ErrInvalidOptions, limit)
	}
	query, args := o.q.ListPublished(before, limit)
	rows, err := o.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlxoutbox: list published events: %w", dialect.CheckMigrated(err, o.q.Table()))
	}
	evs, err := dialect.CollectEvents(rows)
	if err != nil {
		return nil, fmt.Errorf("sqlxoutbox: list published events: %w", err)
	}
	return evs, nil
}

// DeleteArchived deletes the events at seqs that are still published before
// the given time, in one statement, and returns how many it deleted. An
// event made pending again since it was listed is kept.
func (o *Outbox) DeleteArchived(ctx context.Context, seqs []int64, before time.Time) (int64, error) {
	if len(seqs) == 0 {
		return 0, nil
	}
	query, args := o.q.DeleteArchived(seqs, before)
	return o.exec(ctx, "delete archived events", query, args)
}

// TryLock takes the named lock of the store's database without waiting
// (dialect.Dialect.TryLock): one archiver at a time among several relays.
func (o *Outbox) TryLock(ctx context.Context, name string) (release func(), ok bool, err error) {
	return o.d.TryLock(ctx, o.db, name)
}
