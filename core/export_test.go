package core

import (
	"context"
	"time"
)

// Internals the external tests (package core_test) reach.
var (
	TruncateError = truncateError
	WakeGrace     = wakeGrace
)

// NextCooldown exposes nextCooldown.
func (r *Relay) NextCooldown(cur time.Duration, claimed int) time.Duration {
	return r.nextCooldown(cur, claimed)
}

// PublishContext exposes publishContext to the benchmark of its cost.
func (r *Relay) PublishContext(ctx context.Context, n int) (context.Context, func() bool) {
	return r.publishContext(ctx, n)
}
