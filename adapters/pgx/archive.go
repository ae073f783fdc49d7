package pgxoutbox

import (
	"context"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// ListPublished returns at most limit events published before the given
// time, in Seq order: the source of an archiver (package archive).
func (o *Outbox) ListPublished(ctx context.Context, before time.Time, limit int) ([]core.Event, error) {
	evs, err := o.store.ListPublished(ctx, before, limit)
	return evs, rename(err)
}

// DeleteArchived deletes the events at seqs that are still published before
// the given time and returns how many it deleted.
func (o *Outbox) DeleteArchived(ctx context.Context, seqs []int64, before time.Time) (int64, error) {
	n, err := o.store.DeleteArchived(ctx, seqs, before)
	return n, rename(err)
}

// TryLock takes the named advisory lock of the pool's database without
// waiting: one archiver at a time among several relays.
func (o *Outbox) TryLock(ctx context.Context, name string) (release func(), ok bool, err error) {
	release, ok, err = o.store.TryLock(ctx, name)
	return release, ok, rename(err)
}
