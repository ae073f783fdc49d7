package ordered

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/sqlclaim"
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
	d    dialect.Dialect
	q    *dialect.Queries
	opts StoreOptions
	// claims opens and finishes the claims.
	claims *sqlclaim.Claimer
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
	return &Store{
		d: d, q: q, opts: opts,
		claims: &sqlclaim.Claimer{DB: db, Q: q, Log: opts.Logger, Prefix: "txoutbox/ordered"},
	}, nil
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
	tx, err := s.claims.Begin(ctx)
	if err != nil {
		return nil, err
	}
	query, args := s.q.Claim(limit, 0)
	if o != nil {
		locked, err := s.lockPartitions(ctx, tx, o.Partitions)
		if err != nil {
			s.claims.Rollback(tx)
			return nil, err
		}
		if len(locked) == 0 {
			s.claims.Rollback(tx)
			return s.claims.Empty(), nil
		}
		oc := *o
		oc.Partitions = locked
		query, args = s.q.ClaimOrdered(oc, limit, 0)
	}
	// An empty claim rolls back at once, giving the partitions back.
	return s.claims.QueryLocked(ctx, tx, query, args)
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
	sort := dialect.SortClaimed
	if ordered {
		sort = sortBySeq
	}
	return s.claims.QueryLeased(ctx, query, args, sort)
}

func sortBySeq(evs []core.Event) {
	slices.SortFunc(evs, func(a, b core.Event) int { return cmp.Compare(a.Seq, b.Seq) })
}
