// Package watermillbroker plugs any Watermill message.Publisher into the
// relay as a core.Publisher, and converts events to Watermill messages for
// the brokers of this module.
//
// core depends on no messaging framework; this package is where txoutbox
// meets Watermill.
package watermillbroker

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txoutbox/txoutbox/core"
)

// NewMessage converts an event to a Watermill message: the message UUID is
// the event ID, the payload is the event payload and the metadata holds
// MessageHeaders. The message carries ctx, so that trace context set by the
// relay reaches the broker's publisher.
func NewMessage(ctx context.Context, ev *core.Event) *message.Message {
	msg := message.NewMessage(ev.ID, message.Payload(ev.Payload))
	for k, v := range ev.MessageHeaders() {
		msg.Metadata.Set(k, v)
	}
	msg.SetContext(ctx)
	return msg
}

// Options configures a Publisher.
type Options struct {
	// Topic chooses an event's topic. Default core.TopicByEventType.
	Topic core.TopicFunc
	// PreservesAggregateOrder declares that the Watermill publisher's
	// broker delivers one aggregate's messages in the order they were
	// published (the relay then runs in ordered mode by default). Set it
	// only when that is true of the broker and its topic layout.
	PreservesAggregateOrder bool
}

// Publisher publishes events through a Watermill message.Publisher, one
// message per Publish call of the Watermill publisher, so that each event's
// failure is its own.
type Publisher struct {
	pub  message.Publisher
	opts Options
}

var _ core.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher that sends through pub. It panics on a
// nil pub, as a programming error.
func NewPublisher(pub message.Publisher, opts Options) *Publisher {
	if pub == nil {
		panic("watermillbroker.NewPublisher: nil message.Publisher")
	}
	if opts.Topic == nil {
		opts.Topic = core.TopicByEventType
	}
	return &Publisher{pub: pub, opts: opts}
}

// Capabilities implements core.Publisher.
func (p *Publisher) Capabilities() core.PublisherCapabilities {
	return core.PublisherCapabilities{PreservesAggregateOrder: p.opts.PreservesAggregateOrder}
}

// Publish sends every event in order and reports failures per event. It
// stops at a cancelled context and reports the rest as failed. An event
// without a topic fails permanently.
func (p *Publisher) Publish(ctx context.Context, events []core.Event) error {
	be := core.NewBatchError(len(events))
	for i := range events {
		if err := ctx.Err(); err != nil {
			be.Errs[i] = err
			continue
		}
		ev := &events[i]
		topic := p.opts.Topic(ev)
		if topic == "" {
			be.Errs[i] = core.Permanent(fmt.Errorf("%w: no topic for %s event %s", core.ErrInvalidEvent, ev.EventType, ev.ID))
			continue
		}
		if err := p.pub.Publish(topic, NewMessage(ctx, ev)); err != nil {
			be.Errs[i] = fmt.Errorf("watermillbroker: publish %s event %s to %q: %w", ev.EventType, ev.ID, topic, err)
		}
	}
	return be.ErrOrNil()
}

// Close closes the underlying Watermill publisher.
func (p *Publisher) Close() error { return p.pub.Close() }
