package sqlxoutbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// Claim implements core.Store.
//
// An unordered claim on PostgreSQL opens a transaction that holds the
// claimed rows locked until Commit or Release, and marks them published in
// the same statement that locks them: Commit then only undoes what failed,
// and a batch that published in full costs three round trips (BEGIN,
// claim, COMMIT) instead of four (dialect.Queries.ClaimMarked tells why that
// is as safe as marking afterwards). On a pool of pgx's stdlib driver the
// claim runs on pgx's own connection, reserved from the pool: BEGIN travels
// with the claim and the outcome with COMMIT, two round trips a batch, and
// rows are scanned without database/sql's conversions. With
// Options.DeleteOnPublish the claim only locks the rows, as on MySQL, and
// Commit deletes the published ones (on pgx's connection too, with the
// same two round trips).
//
// An ordered claim (req.Ordered) on PostgreSQL is a transaction that first
// takes the advisory lock of each requested partition no other claim holds,
// then claims from those partitions only, in Seq order, holding back an
// event while an earlier one of its aggregate is in backoff (or dead, under
// core.DeadLetterBlock); locks and row locks last until Commit or Release.
//
// On SQLite a claim stamps a lease on the rows in one statement (see the
// package documentation).
func (o *Outbox) Claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	c, err := o.claim(ctx, req)
	return c, dialect.CheckMigrated(err, o.q.Table())
}

func (o *Outbox) claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	if req.Limit <= 0 {
		return nil, fmt.Errorf("%w: claim limit %d", core.ErrInvalidOptions, req.Limit)
	}
	if oc := req.Ordered; oc != nil {
		return o.orderedClaim(ctx, req.Limit, oc)
	}
	if o.d.ClaimMode() == dialect.ClaimLease {
		query, args := o.q.Claim(req.Limit, o.opts.ClaimLease)
		return o.claims.QueryLeased(ctx, query, args, dialect.SortClaimed)
	}
	if !o.d.ClaimMarks() || o.opts.DeleteOnPublish {
		// MySQL, or rows deleted on publish: lock the rows now, mark or
		// delete them with the outcome.
		query, args := o.q.Claim(req.Limit, 0)
		if o.native {
			return o.claims.QueryLockedNative(ctx, query, args, req.Limit)
		}
		tx, err := o.claims.Begin(ctx)
		if err != nil {
			return nil, err
		}
		return o.claims.QueryLocked(ctx, tx, query, args)
	}
	query, args := o.q.ClaimMarked(req.Limit, !o.opts.SyncMark)
	if o.native {
		return o.claims.QueryMarkedNative(ctx, query, args, req.Limit)
	}
	tx, err := o.claims.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return o.claims.QueryMarked(ctx, tx, query, args)
}

func (o *Outbox) orderedClaim(ctx context.Context, limit int, oc *core.OrderedClaim) (core.Claim, error) {
	if oc.PartitionCount <= 0 {
		return nil, fmt.Errorf("%w: ordered claim with PartitionCount %d", core.ErrInvalidOptions, oc.PartitionCount)
	}
	if oc.Partitions == nil {
		all := *oc
		all.Partitions = make([]int, oc.PartitionCount)
		for i := range all.Partitions {
			all.Partitions[i] = i
		}
		oc = &all
	}
	if o.d.ClaimMode() == dialect.ClaimLease {
		// One writer, one relay: no partitions to share (and no hash
		// function in SQLite's SQL to compute them with).
		if len(oc.Partitions) != oc.PartitionCount {
			return nil, fmt.Errorf("%w: %s serves ordered claims of every partition only, not %d of %d",
				core.ErrUnsupported, o.d, len(oc.Partitions), oc.PartitionCount)
		}
		query, args := o.q.ClaimOrdered(*oc, limit, o.opts.ClaimLease)
		return o.claims.QueryLeased(ctx, query, args, sortBySeq)
	}
	if err := o.ensurePartitionLocks(ctx, oc.PartitionCount); err != nil {
		return nil, err
	}
	tx, err := o.claims.Begin(ctx)
	if err != nil {
		return nil, err
	}
	locked, err := o.lockPartitions(ctx, tx, oc.Partitions)
	if err != nil {
		o.claims.Rollback(tx)
		return nil, err
	}
	if len(locked) == 0 {
		o.claims.Rollback(tx)
		return o.claims.Empty(), nil
	}
	mine := *oc
	mine.Partitions = locked
	query, args := o.q.ClaimOrdered(mine, limit, 0)
	if !o.d.ClaimMarks() {
		return o.orderedClaimTwoStep(ctx, tx, query, args)
	}
	// An empty claim rolls back at once, giving the partitions back.
	return o.claims.QueryLocked(ctx, tx, query, args)
}

// orderedClaimTwoStep is the MySQL ordered claim in tx, which holds the
// partition locks: select the candidates, then lock them (see
// dialect.Queries.LockOrdered). A candidate that is no longer due when it
// is locked (an operator re-queued, replayed or purged it meanwhile) takes
// its aggregate's later candidates out of the claim, which they would
// otherwise overtake.
func (o *Outbox) orderedClaimTwoStep(ctx context.Context, tx *sql.Tx, query string, args []any) (core.Claim, error) {
	var seqs []int64
	rows, err := tx.QueryContext(ctx, query, args...)
	if err == nil {
		for rows.Next() {
			var seq int64
			if err = rows.Scan(&seq); err != nil {
				break
			}
			seqs = append(seqs, seq)
		}
		err = errors.Join(err, rows.Err(), rows.Close())
	}
	if err != nil {
		o.claims.Rollback(tx)
		return nil, fmt.Errorf("sqlxoutbox: claim: %w", err)
	}
	if len(seqs) == 0 {
		o.claims.Rollback(tx)
		return o.claims.Empty(), nil
	}
	query, args = o.q.LockOrdered(seqs)
	return o.claims.QueryLockedFiltered(ctx, tx, query, args, func(evs []core.Event) []core.Event {
		if len(evs) == len(seqs) {
			return evs
		}
		// A candidate that was not returned has no row to tell its
		// aggregate by: keep only the events before it, which no
		// aggregate's order can fault.
		got := make(map[int64]bool, len(evs))
		for _, ev := range evs {
			got[ev.Seq] = true
		}
		gap := int64(math.MaxInt64)
		for _, s := range seqs {
			if !got[s] {
				gap = min(gap, s)
			}
		}
		kept := evs[:0]
		for _, ev := range evs {
			if ev.Seq < gap {
				kept = append(kept, ev)
			}
		}
		return kept
	})
}

func (o *Outbox) lockPartitions(ctx context.Context, tx *sql.Tx, parts []int) ([]int, error) {
	query, args := o.q.LockPartitions(parts)
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlxoutbox: lock partitions: %w", err)
	}
	defer rows.Close()
	var locked []int
	for rows.Next() {
		var p int
		if err := rows.Scan(&p); err != nil {
			return nil, fmt.Errorf("sqlxoutbox: lock partitions: %w", err)
		}
		locked = append(locked, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlxoutbox: lock partitions: %w", err)
	}
	return locked, nil
}

// ensurePartitionLocks creates, on MySQL, the partition lock rows that
// ordered claims of n partitions lock, once per Outbox and n.
func (o *Outbox) ensurePartitionLocks(ctx context.Context, n int) error {
	query, args := o.q.CreatePartitionLocks(n)
	if query == "" {
		return nil
	}
	if _, done := o.partitionLocks.Load(n); done {
		return nil
	}
	if _, err := o.db.ExecContext(ctx, query, args...); err != nil {
		return fmt.Errorf("sqlxoutbox: create partition locks: %w", err)
	}
	o.partitionLocks.Store(n, true)
	return nil
}

func sortBySeq(evs []core.Event) {
	slices.SortFunc(evs, func(a, b core.Event) int { return cmp.Compare(a.Seq, b.Seq) })
}
