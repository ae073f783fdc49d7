package core

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// RetryPolicy decides when a failed event is tried again and when it is
// dead-lettered. The zero value is replaced by DefaultRetryPolicy field by
// field.
type RetryPolicy struct {
	// MaxAttempts is the number of attempts after which an event is
	// dead-lettered. Default 25: with the default backoff that is roughly
	// three hours of broker outage before the first event goes dead.
	MaxAttempts int
	// InitialBackoff is the wait after the first failure. Default 1s.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait. Default 10m.
	MaxBackoff time.Duration
	// Multiplier grows the wait per attempt. Default 2.
	Multiplier float64
	// Jitter is the fraction (0..1) of the wait that is randomised, so that
	// events failed together do not retry together. Default 0.2. Use a
	// negative value for no jitter.
	Jitter float64
}

// DefaultRetryPolicy is used for every zero field of a RetryPolicy.
var DefaultRetryPolicy = RetryPolicy{
	MaxAttempts:    25,
	InitialBackoff: time.Second,
	MaxBackoff:     10 * time.Minute,
	Multiplier:     2,
	Jitter:         0.2,
}

// validate refuses values that have no meaning: negative counts or waits,
// a Multiplier below 1, a Jitter above 1.
func (p RetryPolicy) validate() error {
	switch {
	case p.MaxAttempts < 0:
		return fmt.Errorf("%w: RetryPolicy.MaxAttempts %d is negative", ErrInvalidOptions, p.MaxAttempts)
	case p.InitialBackoff < 0:
		return fmt.Errorf("%w: RetryPolicy.InitialBackoff %s is negative", ErrInvalidOptions, p.InitialBackoff)
	case p.MaxBackoff < 0:
		return fmt.Errorf("%w: RetryPolicy.MaxBackoff %s is negative", ErrInvalidOptions, p.MaxBackoff)
	case p.Multiplier != 0 && p.Multiplier < 1:
		return fmt.Errorf("%w: RetryPolicy.Multiplier %g is below 1", ErrInvalidOptions, p.Multiplier)
	case p.Jitter > 1:
		return fmt.Errorf("%w: RetryPolicy.Jitter %g is above 1", ErrInvalidOptions, p.Jitter)
	}
	return nil
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	d := DefaultRetryPolicy
	if p.MaxAttempts > 0 {
		d.MaxAttempts = p.MaxAttempts
	}
	if p.InitialBackoff > 0 {
		d.InitialBackoff = p.InitialBackoff
	}
	if p.MaxBackoff > 0 {
		d.MaxBackoff = p.MaxBackoff
	} else if d.InitialBackoff > d.MaxBackoff {
		// An explicit first wait above the default cap is meant literally.
		d.MaxBackoff = d.InitialBackoff
	}
	if p.Multiplier >= 1 {
		d.Multiplier = p.Multiplier
	}
	if p.Jitter != 0 {
		// Negative stays negative, so that defaulting twice keeps "none".
		d.Jitter = min(p.Jitter, 1)
	}
	return d
}

// Backoff returns the wait after the given failed attempt (1 for the first).
func (p RetryPolicy) Backoff(attempt int) time.Duration {
	p = p.withDefaults()
	if attempt < 1 {
		attempt = 1
	}
	d := float64(p.InitialBackoff) * math.Pow(p.Multiplier, float64(attempt-1))
	if d > float64(p.MaxBackoff) || math.IsInf(d, 0) {
		d = float64(p.MaxBackoff)
	}
	if p.Jitter > 0 {
		// Spread over [d*(1-j), d]: never longer than the cap.
		d -= d * p.Jitter * rand.Float64()
	}
	return time.Duration(d)
}

// Exhausted reports whether an event that has failed attempts times is dead.
func (p RetryPolicy) Exhausted(attempts int) bool {
	return attempts >= p.withDefaults().MaxAttempts
}
