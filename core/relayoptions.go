package core

import (
	"fmt"
	"log/slog"
	"time"
)

// Bounds of the size options of RelayOptions: a larger value is a mistake
// (--batch-size 2000000000 would allocate for two billion events), refused
// with an error wrapping ErrInvalidOptions.
const (
	MaxBatchSize     = 10_000
	MaxConcurrency   = 256
	ErrorLengthLimit = 64 << 10
)

// RelayOptions configures a Relay. Zero fields take their defaults.
type RelayOptions struct {
	// BatchSize is how many events one claim takes. Default 100, at most
	// MaxBatchSize.
	BatchSize int
	// PollInterval is how long an idle worker waits before claiming again
	// when nothing woke it. Default 1s.
	PollInterval time.Duration
	// Cooldown is the least time from the start of one claim of a worker to
	// the start of its next when the first was not a full batch. It bounds
	// how often a worker woken by every commit of busy producers claims, so
	// that it takes a few events per claim instead of one, which costs the
	// database (and so the producers) much less, for at most Cooldown of
	// latency. A full batch is followed at once. Default 1ms; negative
	// disables it.
	Cooldown time.Duration
	// MaxCooldown is how far a worker stretches its Cooldown while its
	// claims keep finding only a few events each: under a steady trickle
	// of commits, each of which wakes the relay, the wait doubles from
	// Cooldown up to MaxCooldown, so that one claim gathers what several
	// commits wrote (a claim per event costs the database two to three
	// times the work of a claim per few events). It shrinks back as claims
	// fill up, and a claim that finds nothing resets it, so that the first
	// event after a quiet spell is claimed at once. Default 5ms; set it to
	// Cooldown to claim on every wake-up.
	MaxCooldown time.Duration
	// Concurrency is the number of workers, each with its own claim.
	// Default 1, at most MaxConcurrency; capped by the store's
	// StoreCapabilities.MaxConcurrency.
	Concurrency int
	// Retry decides backoff and dead-lettering.
	Retry RetryPolicy
	// ShutdownTimeout bounds how long a batch in flight may take to finish
	// after Run's context is cancelled. Default 10s. A batch cut off by it
	// is released unmarked and published again later.
	ShutdownTimeout time.Duration
	// PublishTimeout bounds the publishing of one batch: the context given
	// to the Publisher is cancelled after it, and the events it had not
	// sent by then are recorded as failed (wrapping ErrPublishTimeout) and
	// retried after their backoff, so that a hung broker connection holds
	// neither the claim's rows nor, in ordered mode, the relay's partitions
	// for longer. A publisher that ignores its context cannot be cut off;
	// the relay logs a warning when one overruns. Default 30s; negative
	// disables it.
	PublishTimeout time.Duration
	// MaxErrorLength bounds the stored LastError. Default 2000 bytes, at
	// most ErrorLengthLimit.
	MaxErrorLength int
	// Logger receives the relay's structured logs. Default slog.Default().
	Logger *slog.Logger
	// Ordering selects per-aggregate ordering (see docs/ordering.md).
	// Default OrderingAuto: ordered when the publisher's broker keeps
	// per-key order (Kafka, SNS FIFO).
	Ordering OrderingMode
	// Ordered configures ordered mode: the partition leaser shared with
	// other relays, and the dead-letter policy.
	Ordered OrderedOptions
}

func (o RelayOptions) withDefaults() (RelayOptions, error) {
	if o.BatchSize < 0 || o.PollInterval < 0 || o.Concurrency < 0 || o.ShutdownTimeout < 0 || o.MaxErrorLength < 0 {
		return o, fmt.Errorf("%w: negative BatchSize, PollInterval, Concurrency, ShutdownTimeout or MaxErrorLength", ErrInvalidOptions)
	}
	if o.BatchSize > MaxBatchSize {
		return o, fmt.Errorf("%w: BatchSize %d is above the limit of %d", ErrInvalidOptions, o.BatchSize, MaxBatchSize)
	}
	if o.Concurrency > MaxConcurrency {
		return o, fmt.Errorf("%w: Concurrency %d is above the limit of %d", ErrInvalidOptions, o.Concurrency, MaxConcurrency)
	}
	if o.MaxErrorLength > ErrorLengthLimit {
		return o, fmt.Errorf("%w: MaxErrorLength %d is above the limit of %d", ErrInvalidOptions, o.MaxErrorLength, ErrorLengthLimit)
	}
	if err := o.Retry.validate(); err != nil {
		return o, err
	}
	if o.BatchSize == 0 {
		o.BatchSize = 100
	}
	if o.PollInterval == 0 {
		o.PollInterval = time.Second
	}
	switch {
	case o.Cooldown == 0:
		o.Cooldown = time.Millisecond
	case o.Cooldown < 0:
		o.Cooldown = 0
	}
	switch {
	case o.MaxCooldown < 0:
		return o, fmt.Errorf("%w: negative MaxCooldown", ErrInvalidOptions)
	case o.MaxCooldown == 0:
		o.MaxCooldown = max(DefaultMaxCooldown, o.Cooldown)
	case o.MaxCooldown < o.Cooldown:
		return o, fmt.Errorf("%w: MaxCooldown %v below Cooldown %v", ErrInvalidOptions, o.MaxCooldown, o.Cooldown)
	}
	if o.Concurrency == 0 {
		o.Concurrency = 1
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 10 * time.Second
	}
	switch {
	case o.PublishTimeout == 0:
		o.PublishTimeout = 30 * time.Second
	case o.PublishTimeout < 0:
		o.PublishTimeout = 0
	}
	if o.MaxErrorLength == 0 {
		o.MaxErrorLength = 2000
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Retry = o.Retry.withDefaults()
	return o, nil
}
