package core

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// TopicFunc chooses the topic (exchange, Kafka topic, SNS topic) of an event.
type TopicFunc func(ev *Event) string

// TopicByEventType is the default TopicFunc: the topic is the event type.
func TopicByEventType(ev *Event) string { return ev.EventType }

// NewMessage converts an event to a Watermill message: the message UUID is
// the event ID, the payload is the event payload and the metadata holds
// MessageHeaders. The message carries ctx, so that trace context set by the
// relay reaches the broker's publisher.
func NewMessage(ctx context.Context, ev *Event) *message.Message {
	msg := message.NewMessage(ev.ID, message.Payload(ev.Payload))
	for k, v := range ev.MessageHeaders() {
		msg.Metadata.Set(k, v)
	}
	msg.SetContext(ctx)
	return msg
}

// WatermillPublisher publishes events through any Watermill
// message.Publisher, one message per Publish call, so that each event's
// failure is its own.
type WatermillPublisher struct {
	pub   message.Publisher
	topic TopicFunc
}

// NewWatermillPublisher returns a Publisher that sends through pub. A nil
// topic selects TopicByEventType.
func NewWatermillPublisher(pub message.Publisher, topic TopicFunc) *WatermillPublisher {
	if topic == nil {
		topic = TopicByEventType
	}
	return &WatermillPublisher{pub: pub, topic: topic}
}

// Publish sends every event in order and reports failures per event. It stops
// at a cancelled context and reports the rest as failed.
func (p *WatermillPublisher) Publish(ctx context.Context, events []Event) error {
	be := NewBatchError(len(events))
	for i := range events {
		if err := ctx.Err(); err != nil {
			be.Errs[i] = err
			continue
		}
		ev := &events[i]
		topic := p.topic(ev)
		if topic == "" {
			be.Errs[i] = fmt.Errorf("%w: no topic for %s event %s", ErrInvalidEvent, ev.EventType, ev.ID)
			continue
		}
		if err := p.pub.Publish(topic, NewMessage(ctx, ev)); err != nil {
			be.Errs[i] = fmt.Errorf("publish %s event %s to %q: %w", ev.EventType, ev.ID, topic, err)
		}
	}
	return be.ErrOrNil()
}

// Close closes the underlying Watermill publisher.
func (p *WatermillPublisher) Close() error { return p.pub.Close() }
