package ordered

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// ErrInvalidOptions is wrapped by errors that reject a configuration.
var ErrInvalidOptions = errors.New("txoutbox/ordered: invalid options")

// ErrInvalidOutcome is returned (wrapped) by a claim's Commit for an outcome
// that names an event twice or one the claim does not hold. The claim is
// released. It is core.ErrInvalidOutcome, so either name works with
// errors.Is.
var ErrInvalidOutcome = core.ErrInvalidOutcome

// DefaultClaimLease is the default lease of a claim on SQLite.
const DefaultClaimLease = time.Minute

// StoreOptions configures a Store.
type StoreOptions struct {
	// Table is the outbox table. Default dialect.DefaultTable.
	Table string
	// ClaimLease is how long a SQLite claim keeps its events from other
	// claims should the relay die with it. Default DefaultClaimLease.
	ClaimLease time.Duration
	// Logger receives warnings. Default slog.Default().
	Logger *slog.Logger
}

// Store is a core.OrderedStore on database/sql, PostgreSQL (pgx driver) or
// SQLite: the relay side of an outbox table that producers write with any
// adapter. Claims without ClaimRequest.Ordered are the ordinary unordered
// claims.
type Store struct {
	db   *sql.DB
	d    dialect.Dialect
	q    *dialect.Queries
	opts StoreOptions
	log  *slog.Logger
}

// NewStore returns the Store of the outbox table opts.Table on db.
func NewStore(db *sql.DB, d dialect.Dialect, opts StoreOptions) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", ErrInvalidOptions)
	}
	if opts.ClaimLease < 0 {
		return nil, fmt.Errorf("%w: negative ClaimLease", ErrInvalidOptions)
	}
	if opts.ClaimLease == 0 {
		opts.ClaimLease = DefaultClaimLease
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	q, err := d.Queries(opts.Table)
	if err != nil {
		return nil, err
	}
	return &Store{db: db, d: d, q: q, opts: opts, log: opts.Logger}, nil
}

// OrderedClaims implements core.OrderedStore: Claim honours
// ClaimRequest.Ordered on every dialect.
func (s *Store) OrderedClaims() bool { return true }

// MaxConcurrency implements core.ConcurrencyLimiter: SQLite serves one
// claim at a time.
func (s *Store) MaxConcurrency() int {
	if n := s.d.MaxConcurrency(); n > 0 {
		return n
	}
	return 1 << 16
}

// Queries returns the SQL the store runs.
func (s *Store) Queries() *dialect.Queries { return s.q }

// Claim implements core.Store. An ordered claim on PostgreSQL is a
// transaction that first takes the advisory lock of each requested
// partition no other claim holds, then claims from those partitions only;
// locks and row locks last until Commit or Release.
func (s *Store) Claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	if req.Limit <= 0 {
		return nil, fmt.Errorf("%w: claim limit %d", core.ErrInvalidOptions, req.Limit)
	}
	var query string
	var args []any
	if o := req.Ordered; o != nil {
		if o.PartitionCount <= 0 {
			return nil, fmt.Errorf("%w: ordered claim with PartitionCount %d", core.ErrInvalidOptions, o.PartitionCount)
		}
		if o.Partitions == nil {
			all := *o
			all.Partitions = make([]int, o.PartitionCount)
			for i := range all.Partitions {
				all.Partitions[i] = i
			}
			o = &all
		}
		if s.d.ClaimMode() == dialect.ClaimLease {
			query, args = s.q.ClaimOrdered(*o, req.Limit, s.opts.ClaimLease)
			return s.leaseClaim(ctx, query, args, true)
		}
		return s.lockClaim(ctx, req.Limit, o)
	}
	query, args = s.q.Claim(req.Limit, s.opts.ClaimLease)
	if s.d.ClaimMode() == dialect.ClaimLease {
		return s.leaseClaim(ctx, query, args, false)
	}
	return s.lockClaim(ctx, req.Limit, nil)
}

func (s *Store) lockClaim(ctx context.Context, limit int, o *core.OrderedClaim) (core.Claim, error) {
	// The transaction must survive a cancelled ctx: the relay finishes a
	// batch in flight after shutdown begins.
	tx, err := s.db.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return nil, fmt.Errorf("txoutbox/ordered: claim: begin: %w", err)
	}
	query, args := s.q.Claim(limit, 0)
	if o != nil {
		locked, err := s.lockPartitions(ctx, tx, o.Partitions)
		if err != nil {
			s.rollback(tx)
			return nil, err
		}
		if len(locked) == 0 {
			s.rollback(tx)
			return &txClaim{base: newBase(nil), s: s}, nil
		}
		oc := *o
		oc.Partitions = locked
		query, args = s.q.ClaimOrdered(oc, limit, 0)
	}
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		s.rollback(tx)
		return nil, fmt.Errorf("txoutbox/ordered: claim: %w", err)
	}
	evs, err := dialect.CollectEvents(rows)
	if err != nil {
		s.rollback(tx)
		return nil, fmt.Errorf("txoutbox/ordered: claim: %w", err)
	}
	if len(evs) == 0 {
		s.rollback(tx) // nothing to hold: give the partitions back at once
		return &txClaim{base: newBase(nil), s: s}, nil
	}
	return &txClaim{base: newBase(evs), s: s, tx: tx}, nil
}

func (s *Store) lockPartitions(ctx context.Context, tx *sql.Tx, parts []int) ([]int, error) {
	query, args := s.q.LockPartitions(parts)
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("txoutbox/ordered: lock partitions: %w", err)
	}
	defer rows.Close()
	var locked []int
	for rows.Next() {
		var p int
		if err := rows.Scan(&p); err != nil {
			return nil, fmt.Errorf("txoutbox/ordered: lock partitions: %w", err)
		}
		locked = append(locked, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("txoutbox/ordered: lock partitions: %w", err)
	}
	return locked, nil
}

func (s *Store) leaseClaim(ctx context.Context, query string, args []any, ordered bool) (core.Claim, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("txoutbox/ordered: claim: %w", err)
	}
	evs, err := dialect.CollectEvents(rows)
	if err != nil {
		// The lease, if it was taken, expires on its own.
		return nil, fmt.Errorf("txoutbox/ordered: claim: %w", err)
	}
	if ordered {
		slices.SortFunc(evs, func(a, b core.Event) int { return int(min(max(a.Seq-b.Seq, -1), 1)) })
	} else {
		dialect.SortClaimed(evs)
	}
	return &leaseClaim{base: newBase(evs), s: s}, nil
}

func (s *Store) rollback(tx *sql.Tx) {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		s.log.Warn("txoutbox/ordered: rollback failed", "error", err)
	}
}

// execer is what mark writes through: *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// mark records out: one UPDATE for the published events and one for the
// failures.
func (s *Store) mark(ctx context.Context, tx execer, out core.Outcome) error {
	if len(out.Published) > 0 {
		query, args := s.q.MarkPublished(out.Published)
		if _, err := tx.ExecContext(ctx, query, args...); err != nil {
			return fmt.Errorf("txoutbox/ordered: mark %d published: %w", len(out.Published), err)
		}
	}
	if len(out.Failed) > 0 {
		query, args, err := s.q.MarkFailed(out.Failed)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, query, args...); err != nil {
			return fmt.Errorf("txoutbox/ordered: mark %d failed: %w", len(out.Failed), err)
		}
	}
	return nil
}

// base is what both kinds of claim share.
type base struct {
	events []core.Event
	seqs   map[int64]bool
	done   atomic.Bool
}

func newBase(evs []core.Event) base {
	seqs := make(map[int64]bool, len(evs))
	for i := range evs {
		seqs[evs[i].Seq] = true
	}
	return base{events: evs, seqs: seqs}
}

// Events implements core.Claim.
func (c *base) Events() []core.Event { return c.events }

func (c *base) finish() error {
	if !c.done.CompareAndSwap(false, true) {
		return core.ErrClaimDone
	}
	return nil
}

// check validates out against the claim and returns the claimed seqs it
// does not mention.
func (c *base) check(out core.Outcome) (unmentioned []int64, err error) {
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
	for i := range c.events {
		if seq := c.events[i].Seq; !seen[seq] {
			unmentioned = append(unmentioned, seq)
		}
	}
	return unmentioned, nil
}

// txClaim is a PostgreSQL claim: a transaction holding row locks and, when
// ordered, the partitions' advisory locks.
type txClaim struct {
	base
	s  *Store
	tx *sql.Tx // nil for an empty claim
}

// Commit records out and commits; unmentioned events are released.
func (c *txClaim) Commit(ctx context.Context, out core.Outcome) (err error) {
	if err := c.finish(); err != nil {
		return err
	}
	if c.tx == nil {
		return nil
	}
	defer func() {
		if err != nil {
			c.s.rollback(c.tx)
		}
	}()
	if _, err := c.check(out); err != nil {
		return err
	}
	if err := c.s.mark(ctx, c.tx, out); err != nil {
		return err
	}
	if err := c.tx.Commit(); err != nil {
		return fmt.Errorf("txoutbox/ordered: commit claim: %w", err)
	}
	return nil
}

// Release rolls the claim's transaction back.
func (c *txClaim) Release(ctx context.Context) error {
	if err := c.finish(); err != nil {
		return err
	}
	if c.tx == nil {
		return nil
	}
	if err := c.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("txoutbox/ordered: release claim: %w", err)
	}
	return nil
}

// leaseClaim is a SQLite claim: rows stamped with claimed_until.
type leaseClaim struct {
	base
	s *Store
}

// Commit records out and lifts the lease of every claimed event in one
// transaction.
func (c *leaseClaim) Commit(ctx context.Context, out core.Outcome) error {
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
	tx, err := c.s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("txoutbox/ordered: commit claim: begin: %w", err)
	}
	if err := c.s.mark(ctx, tx, out); err != nil {
		c.s.rollback(tx)
		return err
	}
	if len(unmentioned) > 0 {
		query, args := c.s.q.ReleaseLease(unmentioned)
		if _, err := tx.ExecContext(ctx, query, args...); err != nil {
			c.s.rollback(tx)
			return fmt.Errorf("txoutbox/ordered: release %d unmentioned events: %w", len(unmentioned), err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("txoutbox/ordered: commit claim: %w", err)
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
	query, args := c.s.q.ReleaseLease(seqs)
	if _, err := c.s.db.ExecContext(ctx, query, args...); err != nil {
		return fmt.Errorf("txoutbox/ordered: release claim (its lease will expire): %w", err)
	}
	return nil
}
