package core

import (
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Header names the relay sets on every published message, in addition to the
// event's own headers. Consumers deduplicate on HeaderEventID.
const (
	HeaderEventID       = "event_id"
	HeaderAggregateType = "aggregate_type"
	HeaderAggregateID   = "aggregate_id"
	HeaderEventType     = "event_type"
)

// Event is one row of the outbox.
//
// Producers fill EventType, Payload and usually AggregateType, AggregateID and
// Headers, and NotBefore for a scheduled event; NewEvent and Prepare fill
// the ID. The store owns Seq, CreatedAt and the delivery bookkeeping
// (PublishedAt, AttemptCount, LastError, NextAttemptAt, DeadAt).
type Event struct {
	// Seq is the store's position of the event (a BIGSERIAL on PostgreSQL).
	// It orders events and identifies the row to the relay.
	Seq int64
	// ID is the event's globally unique identity and idempotency key: a UUID
	// (version 7 unless the producer set one). It travels as HeaderEventID.
	ID string
	// AggregateType names the kind of entity the event is about ("order").
	AggregateType string
	// AggregateID identifies the entity. It is the Kafka message key and the
	// unit of ordering.
	AggregateID string
	// EventType names what happened ("order.created"). It is the default topic.
	EventType string
	// Payload is the event body; it must be valid JSON.
	Payload json.RawMessage
	// Headers travel with the message (AMQP headers, Kafka headers, SNS
	// message attributes). Keys that collide with the Header* constants are
	// overwritten by the relay.
	Headers map[string]string
	// NotBefore, when set, schedules the event: the relay publishes it no
	// earlier than this time, by the database's clock (a reminder, a
	// timeout, a delayed business step). It is written as the event's
	// first NextAttemptAt, in the producer's transaction like any event.
	// A time already past means now. The zero value publishes at once.
	//
	// In ordered mode a scheduled event does not hold back its
	// aggregate's later events, as a failed one does: it takes its place
	// in the aggregate's order at its time, as if written then. Log mode
	// hands it to the table, whose relay publishes it when it falls due.
	NotBefore time.Time
	// CreatedAt is when the event was written (the database's clock).
	CreatedAt time.Time
	// PublishedAt is set once the broker accepted the event.
	PublishedAt *time.Time
	// AttemptCount counts publish attempts so far.
	AttemptCount int
	// LastError is the error of the latest failed attempt. It is cleared
	// when the event is published.
	LastError string
	// NextAttemptAt is the earliest time the relay may try the event again.
	NextAttemptAt time.Time
	// DeadAt is set when the event exhausted its attempts. Dead events are
	// kept and can be re-queued; the relay no longer claims them.
	DeadAt *time.Time
}

// NewEvent builds an event whose payload is v marshalled to JSON, with a
// fresh UUIDv7 ID, so that the caller knows the event's ID before it is
// written.
func NewEvent(aggregateType, aggregateID, eventType string, v any) (Event, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return Event{}, fmt.Errorf("%w: marshal payload of %s: %w", ErrInvalidEvent, eventType, err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Event{}, fmt.Errorf("txoutbox: generate event id: %w", err)
	}
	return Event{
		ID:            id.String(),
		AggregateType: aggregateType,
		AggregateID:   aggregateID,
		EventType:     eventType,
		Payload:       payload,
	}, nil
}

// Prepare fills the defaults of e (a UUIDv7 ID when none is set, the JSON
// null payload when the payload is empty) and validates it against
// DefaultLimits. Adapters call PrepareEvents, which also runs hooks and
// takes the adapter's Limits; errors wrap ErrInvalidEvent.
func (e *Event) Prepare() error {
	if err := e.fillDefaults(); err != nil {
		return err
	}
	return e.Validate(DefaultLimits)
}

func (e *Event) fillDefaults() error {
	if e.ID == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return fmt.Errorf("txoutbox: generate event id: %w", err)
		}
		e.ID = id.String()
	}
	if len(e.Payload) == 0 {
		e.Payload = json.RawMessage("null")
	}
	return nil
}

// MessageHeaders returns the headers to publish with e: its own headers plus
// the Header* identity headers, which always win.
func (e *Event) MessageHeaders() map[string]string {
	h := make(map[string]string, len(e.Headers)+4)
	for k, v := range e.Headers {
		h[k] = v
	}
	h[HeaderEventID] = e.ID
	h[HeaderEventType] = e.EventType
	if e.AggregateType != "" {
		h[HeaderAggregateType] = e.AggregateType
	}
	if e.AggregateID != "" {
		h[HeaderAggregateID] = e.AggregateID
	}
	return h
}

// validText checks that s can be stored in a text column of every supported
// database and carried by every broker: valid UTF-8 without NUL
// (PostgreSQL's text refuses both).
func validText(field, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidEvent, field)
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return fmt.Errorf("%w: %s contains a NUL byte at offset %d", ErrInvalidEvent, field, i)
		}
	}
	return nil
}
