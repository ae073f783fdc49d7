package sqlxoutbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// Claim implements core.Store. On PostgreSQL it opens a transaction that
// holds the claimed rows locked until Commit or Release; on SQLite it stamps
// a lease on them in one statement (see the package documentation).
func (o *Outbox) Claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	if req.Limit <= 0 {
		return nil, fmt.Errorf("%w: claim limit %d", core.ErrInvalidOptions, req.Limit)
	}
	query, args := o.q.Claim(req.Limit, o.opts.ClaimLease)
	if o.d.ClaimMode() == dialect.ClaimLease {
		rows, err := o.db.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, fmt.Errorf("txoutbox/sqlx: claim: %w", err)
		}
		evs, err := dialect.CollectEvents(rows)
		if err != nil {
			// The lease, if it was taken, expires on its own.
			return nil, fmt.Errorf("txoutbox/sqlx: claim: %w", err)
		}
		dialect.SortClaimed(evs)
		return &leaseClaim{claimBase: newBase(evs), o: o}, nil
	}

	// The transaction must survive a cancelled ctx: the relay finishes a
	// batch in flight after shutdown begins, and database/sql would roll
	// back a transaction whose BeginTx context ends.
	tx, err := o.db.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return nil, fmt.Errorf("txoutbox/sqlx: claim: begin: %w", err)
	}
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		o.rollback(tx)
		return nil, fmt.Errorf("txoutbox/sqlx: claim: %w", err)
	}
	evs, err := dialect.CollectEvents(rows)
	if err != nil {
		o.rollback(tx)
		return nil, fmt.Errorf("txoutbox/sqlx: claim: %w", err)
	}
	if len(evs) == 0 {
		// Nothing to hold: give the connection back at once.
		o.rollback(tx)
		return &lockClaim{claimBase: newBase(nil), o: o}, nil
	}
	return &lockClaim{claimBase: newBase(evs), o: o, tx: tx}, nil
}

func (o *Outbox) rollback(tx *sql.Tx) {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		o.log.Warn("txoutbox/sqlx: rollback failed", "error", err)
	}
}

// claimBase is what both kinds of claim share: the events, the once-only
// guard, and the check of an outcome against the claim.
type claimBase struct {
	events []core.Event
	seqs   map[int64]bool
	done   atomic.Bool
}

func newBase(evs []core.Event) claimBase {
	seqs := make(map[int64]bool, len(evs))
	for i := range evs {
		seqs[evs[i].Seq] = true
	}
	return claimBase{events: evs, seqs: seqs}
}

func (c *claimBase) Events() []core.Event { return c.events }

// finish marks the claim done, or reports that it already was.
func (c *claimBase) finish() error {
	if !c.done.CompareAndSwap(false, true) {
		return core.ErrClaimDone
	}
	return nil
}

// check validates out against the claim and returns the claimed seqs it
// does not mention.
func (c *claimBase) check(out core.Outcome) (unmentioned []int64, err error) {
	seen := make(map[int64]bool, len(out.Published)+len(out.Failed))
	mark := func(seq int64) error {
		if !c.seqs[seq] {
			return fmt.Errorf("%w: event %d is not in the claim", ErrInvalidOutcome, seq)
		}
		if seen[seq] {
			return fmt.Errorf("%w: event %d appears twice", ErrInvalidOutcome, seq)
		}
		seen[seq] = true
		return nil
	}
	for _, s := range out.Published {
		if err := mark(s); err != nil {
			return nil, err
		}
	}
	for _, f := range out.Failed {
		if err := mark(f.Seq); err != nil {
			return nil, err
		}
	}
	for i := range c.events {
		if s := c.events[i].Seq; !seen[s] {
			unmentioned = append(unmentioned, s)
		}
	}
	return unmentioned, nil
}

// lockClaim is a PostgreSQL claim: a transaction holding row locks.
type lockClaim struct {
	claimBase
	o  *Outbox
	tx *sql.Tx // nil for an empty claim
}

// Commit records out with at most two UPDATEs (published, failed) and
// commits; unmentioned events are released by the commit.
func (c *lockClaim) Commit(ctx context.Context, out core.Outcome) (err error) {
	if err := c.finish(); err != nil {
		return err
	}
	if c.tx == nil {
		return nil
	}
	defer func() {
		if err != nil {
			c.o.rollback(c.tx)
		}
	}()
	if _, err := c.check(out); err != nil {
		return err
	}
	if err := c.o.mark(ctx, c.tx, out); err != nil {
		return err
	}
	if err := c.tx.Commit(); err != nil {
		return fmt.Errorf("txoutbox/sqlx: commit claim: %w", err)
	}
	return nil
}

// Release rolls the claim's transaction back.
func (c *lockClaim) Release(ctx context.Context) error {
	if err := c.finish(); err != nil {
		return err
	}
	if c.tx == nil {
		return nil
	}
	if err := c.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("txoutbox/sqlx: release claim: %w", err)
	}
	return nil
}

// mark runs the outcome's UPDATEs on tx: one for every published event and,
// only when some failed, one for every failure.
func (o *Outbox) mark(ctx context.Context, tx Tx, out core.Outcome) error {
	if len(out.Published) > 0 {
		query, args := o.q.MarkPublished(out.Published)
		if _, err := tx.ExecContext(ctx, query, args...); err != nil {
			return fmt.Errorf("txoutbox/sqlx: mark %d published: %w", len(out.Published), err)
		}
	}
	if len(out.Failed) > 0 {
		query, args, err := o.q.MarkFailed(out.Failed)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, query, args...); err != nil {
			return fmt.Errorf("txoutbox/sqlx: mark %d failed: %w", len(out.Failed), err)
		}
	}
	return nil
}

// leaseClaim is a SQLite claim: rows stamped with claimed_until.
type leaseClaim struct {
	claimBase
	o *Outbox
}

// Commit records out and lifts the lease of every claimed event in one
// short transaction.
func (c *leaseClaim) Commit(ctx context.Context, out core.Outcome) (err error) {
	if err := c.finish(); err != nil {
		return err
	}
	if len(c.events) == 0 {
		return nil
	}
	unmentioned, err := c.check(out)
	if err != nil {
		_ = c.release(context.WithoutCancel(ctx), c.all())
		return err
	}
	tx, err := c.o.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("txoutbox/sqlx: commit claim: begin: %w", err)
	}
	if err := c.o.mark(ctx, tx, out); err != nil {
		c.o.rollback(tx)
		return err
	}
	if len(unmentioned) > 0 {
		query, args := c.o.q.ReleaseLease(unmentioned)
		if _, err := tx.ExecContext(ctx, query, args...); err != nil {
			c.o.rollback(tx)
			return fmt.Errorf("txoutbox/sqlx: release %d unmentioned events: %w", len(unmentioned), err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("txoutbox/sqlx: commit claim: %w", err)
	}
	return nil
}

// Release lifts the lease, so the events are claimable at once.
func (c *leaseClaim) Release(ctx context.Context) error {
	if err := c.finish(); err != nil {
		return err
	}
	if len(c.events) == 0 {
		return nil
	}
	return c.release(ctx, c.all())
}

func (c *leaseClaim) all() []int64 {
	seqs := make([]int64, len(c.events))
	for i := range c.events {
		seqs[i] = c.events[i].Seq
	}
	return seqs
}

func (c *leaseClaim) release(ctx context.Context, seqs []int64) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	query, args := c.o.q.ReleaseLease(seqs)
	if _, err := c.o.db.ExecContext(ctx, query, args...); err != nil {
		// Not fatal: the lease expires on its own.
		return fmt.Errorf("txoutbox/sqlx: release claim (its lease will expire): %w", err)
	}
	return nil
}
