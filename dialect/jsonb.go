package dialect

import (
	"context"
	"fmt"

	"github.com/txoutbox/txoutbox/core"
)

// CheckEvents refuses, with an error wrapping core.ErrInvalidEvent that
// names the event and what is wrong, an event that core.Event.Validate
// accepts but d's outbox table cannot store. Only PostgreSQL refuses
// more: its jsonb payload column takes no \u0000 escape, no unpaired
// surrogate escape and no number beyond numeric's range, and the refused
// INSERT would abort the caller's transaction. MySQL, MariaDB and SQLite
// store the payload as text. Adapters run it with core.PrepareEvents
// through PrepareEvents, before anything is written.
func (d Dialect) CheckEvents(events []core.Event) error {
	if d.kind != kindPostgres {
		return nil
	}
	for i := range events {
		if err := checkJSONB(events[i].Payload); err != nil {
			return fmt.Errorf("%w: payload of %s event %s %w (PostgreSQL's jsonb)", core.ErrInvalidEvent, events[i].EventType, events[i].ID, err)
		}
	}
	return nil
}

// PrepareEvents is core.PrepareEvents (defaults, hooks, validation against
// limits) followed by CheckEvents: everything an adapter on d checks before
// it writes events, in one call so that no write path forgets the
// database's own rules.
func (d Dialect) PrepareEvents(ctx context.Context, events []core.Event, limits core.Limits, hooks []core.EnqueueHook) error {
	if err := core.PrepareEvents(ctx, events, limits, hooks); err != nil {
		return err
	}
	return d.CheckEvents(events)
}

// PostgreSQL's numeric, which jsonb stores numbers in, holds at most 131072
// digits before the decimal point and 16383 after it.
const (
	maxNumericIntDigits   = 131072
	maxNumericScaleDigits = 16383
)

// checkJSONB reports why p, valid JSON (core.Event.Validate checked it),
// cannot be stored as jsonb (nil if it can): a \u0000 escape, an unpaired
// surrogate escape, or a number out of numeric's range. The text is
// scanned once.
func checkJSONB(p []byte) error {
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
