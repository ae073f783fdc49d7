package sqlxoutbox

import (
	"context"
	"fmt"

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
		return o.claims.QueryLeased(ctx, query, args, dialect.SortClaimed)
	}
	tx, err := o.claims.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return o.claims.QueryLocked(ctx, tx, query, args)
}
