package core

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Publisher sends events to a broker.
//
// Publish returns nil when the broker accepted every event, a *BatchError
// when it accepted some and refused others, and any other error when the
// whole batch failed. A publisher must not report an event as published
// before the broker confirmed it. An event that can never be sent (too
// large for the broker, a header it cannot carry) fails alone, with an
// error marked by Permanent, and never fails the other events of its batch.
// When ctx ends, the events not yet confirmed fail with ctx's error.
//
// The conformance suite (outboxtest.RunPublisher) proves a Publisher against
// a real broker.
type Publisher interface {
	Publish(ctx context.Context, events []Event) error
	// Capabilities reports what the broker guarantees. It is constant for
	// the life of the publisher.
	Capabilities() PublisherCapabilities
}

// PublisherCapabilities is what a Publisher's broker guarantees, as data.
type PublisherCapabilities struct {
	// PreservesAggregateOrder: the broker delivers the events of one
	// aggregate in the order they were published (Kafka partitions by key,
	// SNS FIFO message groups). Under OrderingAuto a relay runs in ordered
	// mode when it is set.
	PreservesAggregateOrder bool
	// StoresPositions: the publisher is a PositionPublisher that stores
	// the log position a Publish's context carries with its events, all
	// or nothing (kafkabroker's transactional publisher). Log mode then
	// publishes exactly once.
	StoresPositions bool
}

// PublisherFunc adapts a function to a Publisher with no capabilities.
type PublisherFunc func(ctx context.Context, events []Event) error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, events []Event) error { return f(ctx, events) }

// Capabilities returns the zero PublisherCapabilities.
func (PublisherFunc) Capabilities() PublisherCapabilities { return PublisherCapabilities{} }

// BatchError reports per event which publishes of a batch failed.
type BatchError struct {
	// Errs has one entry per event of the batch, in order; nil means that
	// event was published.
	Errs []error
}

// NewBatchError returns a BatchError for a batch of n events.
func NewBatchError(n int) *BatchError { return &BatchError{Errs: make([]error, n)} }

// Failed reports how many events failed.
func (e *BatchError) Failed() int {
	n := 0
	for _, err := range e.Errs {
		if err != nil {
			n++
		}
	}
	return n
}

// ErrOrNil returns e when at least one event failed, and nil otherwise, so
// that publishers can return it unconditionally.
func (e *BatchError) ErrOrNil() error {
	if e == nil || e.Failed() == 0 {
		return nil
	}
	return e
}

func (e *BatchError) Error() string {
	var first error
	for _, err := range e.Errs {
		if err != nil {
			first = err
			break
		}
	}
	return fmt.Sprintf("txoutbox: %d of %d events failed to publish; first: %v", e.Failed(), len(e.Errs), first)
}

// Unwrap returns the per-event errors, so that errors.Is sees through them.
func (e *BatchError) Unwrap() []error {
	var errs []error
	for _, err := range e.Errs {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// EventErrors expands the error of publishing n events into one error per
// event, as the relay records them.
func EventErrors(err error, n int) []error {
	errs := make([]error, n)
	if err == nil {
		return errs
	}
	var be *BatchError
	if errors.As(err, &be) && len(be.Errs) == n {
		copy(errs, be.Errs)
		return errs
	}
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// truncateError keeps stored errors bounded; a broker can return megabytes.
func truncateError(err error, max int) string {
	s := err.Error()
	if len(s) <= max {
		return s
	}
	s = s[:max]
	// Cut back to a rune boundary so the column holds valid UTF-8.
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// TopicFunc chooses the topic (exchange, Kafka topic, SNS topic) of an event.
type TopicFunc func(ev *Event) string

// TopicByEventType is the default TopicFunc: the topic is the event type.
func TopicByEventType(ev *Event) string { return ev.EventType }
