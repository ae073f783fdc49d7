package core

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// MaxNameBytes bounds EventType, AggregateType, AggregateID and every header
// key: 255 bytes, the longest AMQP short string (routing keys, header
// names), and within what Kafka and SNS accept for keys and attribute
// names.
const MaxNameBytes = 255

// Defaults of Limits.
const (
	// DefaultMaxPayloadBytes is 1 MiB: far below PostgreSQL's jsonb limit
	// and within what RabbitMQ (128 MiB by default) takes; Kafka's default
	// message.max.bytes (about 1 MB, headers included) and SNS (256 KiB,
	// attributes included) take less, and their publishers refuse a larger
	// event permanently (see Permanent) instead of retrying it.
	DefaultMaxPayloadBytes = 1 << 20
	// DefaultMaxHeaders is the default bound on the number of headers of
	// one event, not counting the identity headers the relay adds.
	DefaultMaxHeaders = 32
	// DefaultMaxHeaderBytes is the default bound on the total length of an
	// event's header keys and values.
	DefaultMaxHeaderBytes = 16 << 10
)

// Limits bound what one event may carry. Adapters check them (with
// PrepareEvents) before anything is written, so that an event a database
// or broker would refuse never reaches the caller's transaction: a refused
// statement aborts a PostgreSQL transaction, and with it the caller's
// business rows. Zero fields take their defaults; negative ones are
// invalid.
type Limits struct {
	// MaxPayloadBytes bounds the JSON payload. Default
	// DefaultMaxPayloadBytes.
	MaxPayloadBytes int
	// MaxHeaders bounds the number of headers. Default DefaultMaxHeaders.
	MaxHeaders int
	// MaxHeaderBytes bounds the sum of the lengths of all header keys and
	// values. Default DefaultMaxHeaderBytes.
	MaxHeaderBytes int
}

// DefaultLimits are the limits of an adapter whose Limits are zero.
var DefaultLimits = Limits{
	MaxPayloadBytes: DefaultMaxPayloadBytes,
	MaxHeaders:      DefaultMaxHeaders,
	MaxHeaderBytes:  DefaultMaxHeaderBytes,
}

// WithDefaults returns l with every zero field set to its default, or an
// error wrapping ErrInvalidOptions for a negative one. Adapters call it when
// they are built, so that bad limits fail at start-up.
func (l Limits) WithDefaults() (Limits, error) {
	if l.MaxPayloadBytes < 0 || l.MaxHeaders < 0 || l.MaxHeaderBytes < 0 {
		return l, fmt.Errorf("%w: negative Limits field %+v", ErrInvalidOptions, l)
	}
	if l.MaxPayloadBytes == 0 {
		l.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if l.MaxHeaders == 0 {
		l.MaxHeaders = DefaultMaxHeaders
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	return l, nil
}

// Validate checks e against l (zero fields: their defaults) and returns an
// error wrapping ErrInvalidEvent that names the field and the limit it
// breaks:
//
//   - EventType is set; ID, when set, is a UUID;
//   - EventType, AggregateType, AggregateID and header keys are valid UTF-8
//     without NUL, at most MaxNameBytes long; header keys are not empty;
//   - header values are valid UTF-8 without NUL; at most MaxHeaders headers
//     of at most MaxHeaderBytes in all;
//   - the payload is valid JSON in valid UTF-8, at most MaxPayloadBytes.
//
// What one database cannot store besides (PostgreSQL's jsonb: a \u0000
// escape, an unpaired surrogate, a number beyond numeric's range) its
// dialect checks (dialect.Dialect.CheckEvents), in the adapters of that
// database.
//
// Nothing is changed: a value that cannot travel as it is is refused, never
// rewritten.
func (e *Event) Validate(l Limits) error {
	l, err := l.WithDefaults()
	if err != nil {
		return err
	}
	if e.EventType == "" {
		return fmt.Errorf("%w: EventType is empty", ErrInvalidEvent)
	}
	names := [...]struct{ field, v string }{
		{"EventType", e.EventType}, {"AggregateType", e.AggregateType}, {"AggregateID", e.AggregateID},
	}
	for _, n := range names {
		if err := validName(n.field, n.v); err != nil {
			return fmt.Errorf("%w (event type %.64q)", err, e.EventType)
		}
	}
	if e.ID != "" {
		if _, err := uuid.Parse(e.ID); err != nil {
			return fmt.Errorf("%w: ID %.64q is not a UUID", ErrInvalidEvent, e.ID)
		}
	}
	if !e.NotBefore.IsZero() {
		if y := e.NotBefore.UTC().Year(); y < 1970 || y > 9999 {
			return fmt.Errorf("%w: NotBefore %s is outside the years 1970 to 9999", ErrInvalidEvent, e.NotBefore.UTC().Format(time.RFC3339))
		}
	}
	if len(e.Headers) > l.MaxHeaders {
		return fmt.Errorf("%w: %d headers, the limit is %d (Limits.MaxHeaders)", ErrInvalidEvent, len(e.Headers), l.MaxHeaders)
	}
	total := 0
	for k, v := range e.Headers {
		if k == "" {
			return fmt.Errorf("%w: a header key is empty", ErrInvalidEvent)
		}
		if err := validName(fmt.Sprintf("header key %.64q", k), k); err != nil {
			return err
		}
		if err := validText(fmt.Sprintf("value of header %.64q", k), v); err != nil {
			return err
		}
		total += len(k) + len(v)
	}
	if total > l.MaxHeaderBytes {
		return fmt.Errorf("%w: headers are %d bytes in all, the limit is %d (Limits.MaxHeaderBytes)", ErrInvalidEvent, total, l.MaxHeaderBytes)
	}
	if len(e.Payload) > l.MaxPayloadBytes {
		return fmt.Errorf("%w: payload of %s event %s is %d bytes, the limit is %d (Limits.MaxPayloadBytes)",
			ErrInvalidEvent, e.EventType, e.ID, len(e.Payload), l.MaxPayloadBytes)
	}
	if len(e.Payload) > 0 {
		why := ""
		switch {
		case !utf8.Valid(e.Payload):
			why = "is not valid UTF-8"
		case !json.Valid(e.Payload):
			why = "is not valid JSON"
		}
		if why != "" {
			return fmt.Errorf("%w: payload of %s event %s %s", ErrInvalidEvent, e.EventType, e.ID, why)
		}
	}
	return nil
}

func validName(field, s string) error {
	if len(s) > MaxNameBytes {
		return fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrInvalidEvent, field, len(s), MaxNameBytes)
	}
	return validText(field, s)
}

// PrepareEvents readies events for writing, in place: it fills their
// defaults (a UUIDv7 ID, the null payload), runs the hooks on each, and
// validates each against limits (after the hooks, which may add headers).
// Storage adapters call it at the start of Enqueue, before anything is
// written; it returns an error wrapping ErrInvalidEvent for an invalid
// event, and a hook's error as it is.
func PrepareEvents(ctx context.Context, events []Event, limits Limits, hooks []EnqueueHook) error {
	for i := range events {
		ev := &events[i]
		if err := ev.fillDefaults(); err != nil {
			return err
		}
		for _, h := range hooks {
			if err := h(ctx, ev); err != nil {
				return err
			}
		}
		if err := ev.Validate(limits); err != nil {
			if len(events) > 1 {
				return fmt.Errorf("event %d of %d: %w", i+1, len(events), err)
			}
			return err
		}
	}
	return nil
}
