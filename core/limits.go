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
//   - the payload is valid JSON in valid UTF-8, at most MaxPayloadBytes, and
//     storable in PostgreSQL's jsonb: no \u0000 escape, no unpaired
//     surrogate escape, and no number outside PostgreSQL's numeric range.
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
		if err := checkPayload(e.Payload); err != nil {
			return fmt.Errorf("%w: payload of %s event %s %w", ErrInvalidEvent, e.EventType, e.ID, err)
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

// PostgreSQL's numeric, which jsonb stores numbers in, holds at most 131072
// digits before the decimal point and 16383 after it.
const (
	maxNumericIntDigits   = 131072
	maxNumericScaleDigits = 16383
)

// checkPayload reports why p cannot be stored as jsonb (nil if it can): not
// valid JSON or not UTF-8, a \u0000 escape, an unpaired surrogate escape, or
// a number out of numeric's range. The text is scanned once; JSON's grammar
// is checked by json.Valid.
func checkPayload(p []byte) error {
	if !utf8.Valid(p) {
		return fmt.Errorf("is not valid UTF-8")
	}
	if !json.Valid(p) {
		return fmt.Errorf("is not valid JSON")
	}
	for i := 0; i < len(p); {
		switch c := p[i]; {
		case c == '"':
			n, err := checkString(p[i:])
			if err != nil {
				return fmt.Errorf("at offset %d: %w", i, err)
			}
			i += n
		case c == '-' || (c >= '0' && c <= '9'):
			n, err := checkNumber(p[i:])
			if err != nil {
				return fmt.Errorf("at offset %d: %w", i, err)
			}
			i += n
		default:
			i++
		}
	}
	return nil
}

// checkString checks the JSON string at the start of s (valid JSON) and
// returns its length with the quotes.
func checkString(s []byte) (int, error) {
	pendingHigh := false // the previous escape was a high surrogate
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '"':
			if pendingHigh {
				return 0, fmt.Errorf("has an unpaired surrogate escape, which jsonb refuses")
			}
			return i + 1, nil
		case '\\':
			if s[i+1] != 'u' {
				if pendingHigh {
					return 0, fmt.Errorf("has an unpaired surrogate escape, which jsonb refuses")
				}
				i++
				continue
			}
			r := hex4(s[i+2 : i+6])
			switch {
			case r == 0:
				return 0, fmt.Errorf("has a \\u0000 escape, which jsonb refuses")
			case r >= 0xD800 && r < 0xDC00:
				if pendingHigh {
					return 0, fmt.Errorf("has an unpaired surrogate escape, which jsonb refuses")
				}
				pendingHigh = true
			case r >= 0xDC00 && r < 0xE000:
				if !pendingHigh {
					return 0, fmt.Errorf("has an unpaired surrogate escape, which jsonb refuses")
				}
				pendingHigh = false
			default:
				if pendingHigh {
					return 0, fmt.Errorf("has an unpaired surrogate escape, which jsonb refuses")
				}
			}
			i += 5
		default:
			if pendingHigh {
				return 0, fmt.Errorf("has an unpaired surrogate escape, which jsonb refuses")
			}
		}
	}
	return len(s), nil
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// checkNumber checks the JSON number at the start of s (valid JSON) against
// numeric's range and returns its length.
func checkNumber(s []byte) (int, error) {
	i := 0
	if s[i] == '-' {
		i++
	}
	intStart := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	intPart := s[intStart:i]
	var frac []byte
	if i < len(s) && s[i] == '.' {
		i++
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		frac = s[start:i]
	}
	exp := int64(0)
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		neg := false
		if s[i] == '+' || s[i] == '-' {
			neg = s[i] == '-'
			i++
		}
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			if exp < 1<<40 {
				exp = exp*10 + int64(s[i]-'0')
			}
			i++
		}
		if neg {
			exp = -exp
		}
	}
	// Built only on failure: every number of every payload passes here,
	// and formatting the error up front was most of Enqueue's CPU outside
	// the driver.
	out := func() (int, error) {
		return 0, fmt.Errorf("is a number %.32s… outside PostgreSQL's numeric range (at most %d digits before the point and %d after)",
			s[:i], maxNumericIntDigits, maxNumericScaleDigits)
	}
	if exp >= 1<<30 || exp <= -(1<<30) {
		return out()
	}
	if scale := int64(len(frac)) - exp; scale > maxNumericScaleDigits {
		return out()
	}
	// The decimal position of the first significant digit (0 for the
	// units): only a non-zero number has one.
	msd, nonzero := int64(0), false
	for k, c := range intPart {
		if c != '0' {
			msd, nonzero = int64(len(intPart)-1-k), true
			break
		}
	}
	if !nonzero {
		for k, c := range frac {
			if c != '0' {
				msd, nonzero = -int64(k+1), true
				break
			}
		}
	}
	if nonzero && msd+exp >= maxNumericIntDigits {
		return out()
	}
	return i, nil
}
