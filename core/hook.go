package core

import "context"

// EnqueueHook is called by storage adapters for every event, after its
// defaults are filled and before it is validated and written, inside the
// producer's transaction (see PrepareEvents). Hooks add to the event, for
// example the trace context to its Headers; an error fails the Enqueue.
type EnqueueHook func(ctx context.Context, ev *Event) error
