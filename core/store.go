package core

import (
	"context"
	"errors"
	"time"
)

// ErrClaimDone is returned by a Claim's Commit or Release once the claim has
// already been committed or released.
var ErrClaimDone = errors.New("txoutbox: claim already committed or released")

// ErrInvalidOutcome is returned (wrapped) by a Claim's Commit for an outcome
// that names an event the claim does not hold, or one event twice. The
// claim is released.
var ErrInvalidOutcome = errors.New("txoutbox: invalid outcome")

// ErrEventNotFound is returned (wrapped) by stores asked for an event they do
// not hold.
var ErrEventNotFound = errors.New("txoutbox: event not found")

// Store is what the relay needs from the database that holds the outbox.
//
// Claim hands out due events (unpublished, not dead, next attempt reached)
// that no other open claim holds; on PostgreSQL this is SELECT ... FOR UPDATE
// SKIP LOCKED, so concurrent relays never receive the same event while a claim
// is open. The events of a claim stay invisible to other claims until Commit
// or Release. A claim abandoned by a crashed relay (its connection gone) must
// become claimable again.
type Store interface {
	Claim(ctx context.Context, req ClaimRequest) (Claim, error)
}

// ClaimRequest says what a relay asks of Claim.
type ClaimRequest struct {
	// Limit is the maximum number of events to claim; it is always > 0.
	Limit int
	// Ordered, when set, asks for an ordered claim (see OrderedClaim). The
	// relay sets it only on stores that implement OrderedStore and report
	// OrderedClaims; other stores may ignore it.
	Ordered *OrderedClaim
}

// Claim is a batch of events held by one relay.
type Claim interface {
	// Events returns the claimed events, oldest first. It may be empty.
	Events() []Event
	// Commit records the outcome of the batch in one round trip and releases
	// the claim. Events the outcome does not mention are released unchanged.
	Commit(ctx context.Context, out Outcome) error
	// Release gives the events back untouched, as a crash would.
	Release(ctx context.Context) error
}

// Outcome is the result of publishing a claimed batch.
type Outcome struct {
	// Published lists the Seq of events the broker accepted.
	Published []int64
	// Failed lists the events whose publish failed.
	Failed []Failure
}

// Failure records one failed publish attempt.
type Failure struct {
	Seq int64
	// Err is stored as the event's LastError.
	Err string
	// RetryIn is added to the database's current time to give NextAttemptAt,
	// so that relays on machines with skewed clocks agree.
	RetryIn time.Duration
	// Dead marks the event as dead-lettered: kept, but no longer claimed.
	Dead bool
}

// ConcurrencyLimiter is implemented by stores that cannot serve more than a
// number of concurrent claims (SQLite serves one). The relay caps its
// concurrency to it.
type ConcurrencyLimiter interface {
	MaxConcurrency() int
}

// Stats is a snapshot of the outbox's health.
type Stats struct {
	// Pending counts unpublished, not dead events.
	Pending int64
	// OldestPending is the CreatedAt of the oldest pending event, zero when
	// nothing is pending.
	OldestPending time.Time
	// OldestPendingAge is how long the oldest pending event has waited,
	// measured on the database's clock.
	OldestPendingAge time.Duration
	// Dead counts dead-lettered events.
	Dead int64
	// ByType breaks the counts down by event type; a store may leave it nil.
	ByType map[string]TypeStats
}

// TypeStats is the part of Stats for one event type.
type TypeStats struct {
	Pending          int64
	OldestPendingAge time.Duration
	Dead             int64
}

// StatsReader is implemented by stores that report Stats.
type StatsReader interface {
	Stats(ctx context.Context) (Stats, error)
}

// Cleaner is implemented by stores that can delete published events.
type Cleaner interface {
	// DeletePublished deletes at most limit events published before the
	// given time and returns how many it deleted.
	DeletePublished(ctx context.Context, before time.Time, limit int) (int64, error)
}
