// Package sqlclaim holds the claims of txoutbox's database/sql stores
// (sqlxoutbox and ordered): opening one, checking an outcome against it,
// recording the outcome and releasing it, on PostgreSQL (a transaction
// holding row locks) and SQLite (rows stamped with a lease). The SQL comes
// from package dialect.
package sqlclaim

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// Execer is what Mark writes through: *sql.Tx, or the caller's transaction.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Claimer opens and finishes the claims of one outbox table.
type Claimer struct {
	DB  *sql.DB
	Q   *dialect.Queries
	Log *slog.Logger
	// Prefix starts the error and log messages, for example
	// "txoutbox/sqlx".
	Prefix string
	// AsyncMark marks published events with Q.MarkPublishedAsync, which
	// commits the claim with synchronous_commit off on PostgreSQL.
	AsyncMark bool
	// Delete deletes published events (Q.DeletePublishedNow) instead of
	// marking them; AsyncMark applies to the DELETE as to the mark.
	Delete bool
	// TxOptions are the claim transactions' (Dialect.ClaimTxOptions).
	TxOptions *sql.TxOptions
}

// Begin opens the transaction of a PostgreSQL claim. It survives a
// cancelled ctx: the relay finishes a batch in flight after shutdown
// begins, and database/sql would roll back a transaction whose BeginTx
// context ends.
func (c *Claimer) Begin(ctx context.Context) (*sql.Tx, error) {
	tx, err := c.DB.BeginTx(context.WithoutCancel(ctx), c.TxOptions)
	if err != nil {
		return nil, fmt.Errorf("%s: claim: begin: %w", c.Prefix, err)
	}
	return tx, nil
}

// Rollback rolls tx back, logging a failure.
func (c *Claimer) Rollback(tx *sql.Tx) {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		c.Log.Warn(c.Prefix+": rollback failed", "error", err)
	}
}

// Empty returns a claim of no events.
func (c *Claimer) Empty() core.Claim {
	return &lockClaim{base: newBase(nil), c: c}
}

// QueryLocked runs the claim query on tx, which Begin opened, and returns
// the claim holding tx. On an error, or when nothing was claimed, it rolls
// tx back.
func (c *Claimer) QueryLocked(ctx context.Context, tx *sql.Tx, query string, args []any) (core.Claim, error) {
	return c.QueryLockedFiltered(ctx, tx, query, args, nil)
}

// QueryLockedFiltered is QueryLocked keeping only the events filter
// returns (nil keeps all); the rows it drops stay locked until the claim
// ends, untouched by its outcome.
func (c *Claimer) QueryLockedFiltered(ctx context.Context, tx *sql.Tx, query string, args []any, filter func([]core.Event) []core.Event) (core.Claim, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		c.Rollback(tx)
		return nil, fmt.Errorf("%s: claim: %w", c.Prefix, err)
	}
	evs, err := dialect.CollectEvents(rows)
	if err != nil {
		c.Rollback(tx)
		return nil, fmt.Errorf("%s: claim: %w", c.Prefix, err)
	}
	if filter != nil {
		evs = filter(evs)
	}
	if len(evs) == 0 {
		// Nothing to hold: give the connection back at once.
		c.Rollback(tx)
		return c.Empty(), nil
	}
	return &lockClaim{base: newBase(evs), c: c, tx: tx}, nil
}

// QueryLeased runs a SQLite claim query, which stamps the lease, and returns
// the claim of the events, put in order by sort.
func (c *Claimer) QueryLeased(ctx context.Context, query string, args []any, sort func([]core.Event)) (core.Claim, error) {
	rows, err := c.DB.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: claim: %w", c.Prefix, err)
	}
	evs, err := dialect.CollectEvents(rows)
	if err != nil {
		// The lease, if it was taken, expires on its own.
		return nil, fmt.Errorf("%s: claim: %w", c.Prefix, err)
	}
	sort(evs)
	return &leaseClaim{base: newBase(evs), c: c}, nil
}

// Mark runs the outcome's statements on tx: one for every published event
// (an UPDATE, or with Delete a DELETE) and, only when some failed, one
// UPDATE for every failure.
func (c *Claimer) Mark(ctx context.Context, tx Execer, out core.Outcome) error {
	stmts, err := c.outcome(out)
	if err != nil {
		return err
	}
	for _, st := range stmts {
		if _, err := tx.ExecContext(ctx, st.query, st.args...); err != nil {
			return fmt.Errorf("%s: %s: %w", c.Prefix, st.what, err)
		}
	}
	return nil
}

// outcome returns the statements Mark runs.
func (c *Claimer) outcome(out core.Outcome) ([]statement, error) {
	var stmts []statement
	if n := len(out.Published); n > 0 {
		switch {
		case c.Delete:
			query, args := c.Q.DeletePublishedNow(out.Published, c.AsyncMark)
			stmts = append(stmts, statement{query, args, fmt.Sprintf("delete %d published", n)})
		case c.AsyncMark:
			query, args := c.Q.MarkPublishedAsync(out.Published)
			stmts = append(stmts, statement{query, args, fmt.Sprintf("mark %d published", n)})
		default:
			query, args := c.Q.MarkPublished(out.Published)
			stmts = append(stmts, statement{query, args, fmt.Sprintf("mark %d published", n)})
		}
	}
	if len(out.Failed) > 0 {
		query, args, err := c.Q.MarkFailed(out.Failed)
		if err != nil {
			return nil, err
		}
		stmts = append(stmts, statement{query, args, fmt.Sprintf("mark %d failed", len(out.Failed))})
	}
	return stmts, nil
}

// base is what both kinds of claim share: the events, the once-only guard,
// and the check of an outcome against the claim.
type base struct {
	events []core.Event
	index  map[int64]int // seq -> position in events
	done   atomic.Bool
}

func newBase(evs []core.Event) base {
	index := make(map[int64]int, len(evs))
	for i := range evs {
		index[evs[i].Seq] = i
	}
	return base{events: evs, index: index}
}

// Events implements core.Claim.
func (b *base) Events() []core.Event { return b.events }

// finish marks the claim done, or reports that it already was.
func (b *base) finish() error {
	if !b.done.CompareAndSwap(false, true) {
		return core.ErrClaimDone
	}
	return nil
}

// statement is one SQL statement to run, with what it does for errors.
type statement struct {
	query string
	args  []any
	what  string
}

// markedOutcome checks out against a claim-and-mark claim and returns the
// statements that record it before COMMIT: failed events back to pending
// with their errors, and unmentioned ones back to pending untouched (one
// UPDATE each, only when there are any). Published events need none: the
// claim marked them; only those that carried the error of an earlier
// attempt have it cleared, so that a published row shows no error.
func (b *base) markedOutcome(q *dialect.Queries, out core.Outcome) ([]statement, error) {
	unmentioned, err := b.check(out)
	if err != nil {
		return nil, err
	}
	var stmts []statement
	var stale []int64
	for _, seq := range out.Published {
		if b.events[b.index[seq]].LastError != "" {
			stale = append(stale, seq)
		}
	}
	if len(stale) > 0 {
		query, args := q.ClearLastError(stale)
		stmts = append(stmts, statement{query, args, fmt.Sprintf("clear the last error of %d published events", len(stale))})
	}
	if len(out.Failed) > 0 {
		query, args, err := q.UnclaimFailed(out.Failed)
		if err != nil {
			return nil, err
		}
		stmts = append(stmts, statement{query, args, fmt.Sprintf("mark %d failed", len(out.Failed))})
	}
	if len(unmentioned) > 0 {
		query, args := q.Unclaim(unmentioned)
		stmts = append(stmts, statement{query, args, fmt.Sprintf("release %d unmentioned events", len(unmentioned))})
	}
	return stmts, nil
}

// check validates out against the claim and returns the claimed seqs it
// does not mention.
func (b *base) check(out core.Outcome) (unmentioned []int64, err error) {
	seen := make([]bool, len(b.events))
	mark := func(seq int64) error {
		i, ok := b.index[seq]
		if !ok {
			return fmt.Errorf("%w: event %d is not in the claim", core.ErrInvalidOutcome, seq)
		}
		if seen[i] {
			return fmt.Errorf("%w: event %d appears twice", core.ErrInvalidOutcome, seq)
		}
		seen[i] = true
		return nil
	}
	for _, seq := range out.Published {
		if err := mark(seq); err != nil {
			return nil, err
		}
	}
	for _, f := range out.Failed {
		if err := mark(f.Seq); err != nil {
			return nil, err
		}
	}
	for i := range b.events {
		if !seen[i] {
			unmentioned = append(unmentioned, b.events[i].Seq)
		}
	}
	return unmentioned, nil
}

func (b *base) all() []int64 {
	seqs := make([]int64, len(b.events))
	for i := range b.events {
		seqs[i] = b.events[i].Seq
	}
	return seqs
}

// lockClaim is a PostgreSQL claim: a transaction holding row locks (and
// whatever else the store took in it, such as advisory locks).
type lockClaim struct {
	base
	c  *Claimer
	tx *sql.Tx // nil for an empty claim
}

// Commit records out with at most two UPDATEs (published, failed) and
// commits; unmentioned events are released by the commit.
func (l *lockClaim) Commit(ctx context.Context, out core.Outcome) (err error) {
	if err := l.finish(); err != nil {
		return err
	}
	if l.tx == nil {
		return nil
	}
	defer func() {
		if err != nil {
			l.c.Rollback(l.tx)
		}
	}()
	if _, err := l.check(out); err != nil {
		return err
	}
	if err := l.c.Mark(ctx, l.tx, out); err != nil {
		return err
	}
	if err := l.tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit claim: %w", l.c.Prefix, err)
	}
	return nil
}

// Release rolls the claim's transaction back.
func (l *lockClaim) Release(ctx context.Context) error {
	if err := l.finish(); err != nil {
		return err
	}
	if l.tx == nil {
		return nil
	}
	if err := l.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("%s: release claim: %w", l.c.Prefix, err)
	}
	return nil
}

// leaseClaim is a SQLite claim: rows stamped with claimed_until.
type leaseClaim struct {
	base
	c *Claimer
}

// Commit records out and lifts the lease of every claimed event in one
// short transaction.
func (l *leaseClaim) Commit(ctx context.Context, out core.Outcome) error {
	if err := l.finish(); err != nil {
		return err
	}
	if len(l.events) == 0 {
		return nil
	}
	unmentioned, err := l.check(out)
	if err != nil {
		_ = l.release(context.WithoutCancel(ctx), l.all())
		return err
	}
	tx, err := l.c.DB.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%s: commit claim: begin: %w", l.c.Prefix, err)
	}
	if err := l.c.Mark(ctx, tx, out); err != nil {
		l.c.Rollback(tx)
		return err
	}
	if len(unmentioned) > 0 {
		query, args := l.c.Q.ReleaseLease(unmentioned)
		if _, err := tx.ExecContext(ctx, query, args...); err != nil {
			l.c.Rollback(tx)
			return fmt.Errorf("%s: release %d unmentioned events: %w", l.c.Prefix, len(unmentioned), err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit claim: %w", l.c.Prefix, err)
	}
	return nil
}

// Release lifts the lease, so the events are claimable at once.
func (l *leaseClaim) Release(ctx context.Context) error {
	if err := l.finish(); err != nil {
		return err
	}
	if len(l.events) == 0 {
		return nil
	}
	return l.release(ctx, l.all())
}

func (l *leaseClaim) release(ctx context.Context, seqs []int64) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	query, args := l.c.Q.ReleaseLease(seqs)
	if _, err := l.c.DB.ExecContext(ctx, query, args...); err != nil {
		// Not fatal: the lease expires on its own.
		return fmt.Errorf("%s: release claim (its lease will expire): %w", l.c.Prefix, err)
	}
	return nil
}

// QueryMarked runs a PostgreSQL claim-and-mark query (dialect
// Queries.ClaimMarked) on tx, which Begin opened, and returns the claim
// holding tx, its events in claim order. Its Commit only has to undo what
// did not get published; on an error, or when nothing was claimed, it rolls
// tx back.
func (c *Claimer) QueryMarked(ctx context.Context, tx *sql.Tx, query string, args []any) (core.Claim, error) {
	cl, err := c.QueryLocked(ctx, tx, query, args)
	if err != nil {
		return nil, err
	}
	l := cl.(*lockClaim)
	if l.tx == nil {
		return l, nil
	}
	dialect.SortClaimed(l.events)
	return &markClaim{lockClaim: l}, nil
}

// markClaim is a PostgreSQL claim whose rows the claim already marked
// published, in its still uncommitted transaction.
type markClaim struct{ *lockClaim }

// Commit turns the failed and the unmentioned events back into pending ones
// (one UPDATE each, only when there are any) and commits, which makes the
// rest published.
func (m *markClaim) Commit(ctx context.Context, out core.Outcome) (err error) {
	l := m.lockClaim
	if err := l.finish(); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			l.c.Rollback(l.tx)
		}
	}()
	stmts, err := l.markedOutcome(l.c.Q, out)
	if err != nil {
		return err
	}
	for _, st := range stmts {
		if _, err := l.tx.ExecContext(ctx, st.query, st.args...); err != nil {
			return fmt.Errorf("%s: %s: %w", l.c.Prefix, st.what, err)
		}
	}
	if err := l.tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit claim: %w", l.c.Prefix, err)
	}
	return nil
}
