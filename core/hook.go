package core

import "context"

// EnqueueHook is called by storage adapters for every event, after Prepare
// and before the row is written, inside the producer's transaction. Hooks
// add to the event, for example the trace context to its Headers; an error
// fails the Enqueue.
type EnqueueHook func(ctx context.Context, ev *Event) error

// RunEnqueueHooks prepares each event and runs the hooks on it, in order. It
// is what adapters call at the start of Enqueue.
func RunEnqueueHooks(ctx context.Context, events []Event, hooks []EnqueueHook) error {
	for i := range events {
		if err := events[i].Prepare(); err != nil {
			return err
		}
		for _, h := range hooks {
			if err := h(ctx, &events[i]); err != nil {
				return err
			}
		}
	}
	return nil
}
