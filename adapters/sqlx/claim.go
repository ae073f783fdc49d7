package sqlxoutbox

import (
	"context"
	"fmt"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// Claim implements core.Store. On PostgreSQL it opens a transaction that
// holds the claimed rows locked until Commit or Release, and marks them
// published in the same statement that locks them: Commit then only undoes
// what failed, and a batch that published in full costs three round trips
// (BEGIN, claim, COMMIT) instead of four (dialect.Queries.ClaimMarked tells
// why that is as safe as marking afterwards). On a pool of pgx's stdlib
// driver the claim runs on pgx's own connection, reserved from the pool: BEGIN
// travels with the claim and the outcome with COMMIT, two round trips a
// batch, and rows are scanned without database/sql's conversions. On SQLite it stamps a lease on
// them in one statement (see the package documentation).
func (o *Outbox) Claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	if req.Limit <= 0 {
		return nil, fmt.Errorf("%w: claim limit %d", core.ErrInvalidOptions, req.Limit)
	}
	if o.d.ClaimMode() == dialect.ClaimLease {
		query, args := o.q.Claim(req.Limit, o.opts.ClaimLease)
		return o.claims.QueryLeased(ctx, query, args, dialect.SortClaimed)
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
