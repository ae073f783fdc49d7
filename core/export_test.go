package core

import "context"

// Internals the external tests (package core_test) reach.
var (
	TruncateError = truncateError
	WakeGrace     = wakeGrace
)

// PublishContext exposes publishContext to the benchmark of its cost.
func (r *Relay) PublishContext(ctx context.Context, n int) (context.Context, func() bool) {
	return r.publishContext(ctx, n)
}
