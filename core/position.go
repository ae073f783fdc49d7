package core

import "context"

// PositionPublisher is a Publisher that stores a log position with the
// events of a Publish, in the same atomic write, when the Publish's
// context carries one (WithPosition), and reads the last stored position
// back. Log mode (package logmode) publishes each batch with the position
// it ends at, and a relay that starts, after another was killed between
// its publish and its confirmation to the database, skips what the
// database sends again up to the stored position: the broker then holds
// each event once. kafkabroker's transactional publisher is one. A
// PositionPublisher reports PublisherCapabilities.StoresPositions, which
// it may leave false when configured not to store them.
type PositionPublisher interface {
	Publisher
	// CommittedPosition takes over the publisher's stream of positions,
	// fencing any other publisher of it (whose later writes then fail),
	// and returns the last position stored, 0 if none.
	CommittedPosition(ctx context.Context) (uint64, error)
}

// PublisherWrapper is a decorator of a Publisher (package metrics',
// tracing's, seal's): Unwrap returns the publisher it decorates, on which
// PublisherAs looks for what the decorator itself does not implement. A
// decorator passes each Publish's context and events on in one call, so
// that a position the context carries covers exactly those events.
type PublisherWrapper interface {
	Unwrap() Publisher
}

// PublisherAs returns the first of p and the publishers it wraps
// (PublisherWrapper) that implements T, one of the optional interfaces of
// a Publisher, and false when none does.
func PublisherAs[T any](p Publisher) (T, bool) {
	for p != nil {
		if t, ok := any(p).(T); ok {
			return t, true
		}
		w, ok := p.(PublisherWrapper)
		if !ok {
			break
		}
		p = w.Unwrap()
	}
	var zero T
	return zero, false
}

type positionKey struct{}

// WithPosition returns ctx carrying a log position: a PositionPublisher's
// Publish under it stores pos with the events, all or nothing.
func WithPosition(ctx context.Context, pos uint64) context.Context {
	return context.WithValue(ctx, positionKey{}, pos)
}

// PositionOf returns the position ctx carries (WithPosition).
func PositionOf(ctx context.Context) (uint64, bool) {
	pos, ok := ctx.Value(positionKey{}).(uint64)
	return pos, ok
}
