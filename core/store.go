package core

import (
	"context"
	"log/slog"
	"time"
)

// Store is what the relay needs from the database that holds the outbox.
//
// Claim hands out due events (unpublished, not dead, next attempt reached)
// that no other open claim holds; on PostgreSQL this is SELECT ... FOR UPDATE
// SKIP LOCKED, so concurrent relays never receive the same event while a claim
// is open. The events of a claim stay invisible to other claims until Commit
// or Release. A claim abandoned by a crashed relay (its connection gone) must
// become claimable again.
//
// Stats and DeletePublished serve the lag monitor and retention (Monitor,
// Cleanup); Capabilities says, as data, what else the store can do, so that
// decorators such as package metrics forward all of it by forwarding one
// value. The conformance suite (package outboxtest) proves a Store, and
// adapters/memory is the reference implementation.
type Store interface {
	// Claim hands out a batch of due events (see ClaimRequest).
	Claim(ctx context.Context, req ClaimRequest) (Claim, error)
	// Stats reports the outbox's health. A store that cannot returns an
	// error wrapping ErrUnsupported.
	Stats(ctx context.Context) (Stats, error)
	// DeletePublished deletes at most limit events published before the
	// given time and returns how many it deleted. Pending and dead events
	// are never deleted. A store that cannot returns an error wrapping
	// ErrUnsupported.
	DeletePublished(ctx context.Context, before time.Time, limit int) (int64, error)
	// Capabilities reports what the store can do. It is constant for the
	// life of the store.
	Capabilities() StoreCapabilities
}

// StoreCapabilities is what a Store can do beyond the unordered claim, as
// data: decorators forward the value whole, and the relay decides from it.
type StoreCapabilities struct {
	// OrderedClaims: Claim honours ClaimRequest.Ordered.
	OrderedClaims bool
	// OrderedPartitions: ordered claims honour OrderedClaim.Partitions, so
	// that relays (and one relay's workers) can share the partitions.
	// Without it a store serves ordered claims of every partition only
	// (Partitions nil; SQLite, which has one writer), refuses a subset
	// with ErrUnsupported, and the relay asks it for every partition.
	OrderedPartitions bool
	// MaxConcurrency is the most claims the store serves at once (SQLite
	// serves one); 0 means no limit of its own. The relay caps its
	// Concurrency to it.
	MaxConcurrency int
	// Wakeups, when not nil, is notified whenever events are written
	// through the store's adapter in this process (its Enqueue, its GORM
	// plugin). A relay running on the store subscribes to it, so that a
	// producer's commit wakes the relay at once instead of at its next poll,
	// with no wiring by the caller. Other processes need a cross-process
	// signal such as package pgnotify.
	Wakeups *Signal
	// NewLeaser, when not nil, builds the PartitionLeaser with which
	// relays of one outbox share the partitions of ordered mode. A relay in
	// ordered mode without RelayOptions.Ordered.Leaser uses it.
	NewLeaser func(LeaserConfig) (PartitionLeaser, error)
	// NextDue, when not nil, reports how long, by the database's clock,
	// until the next event that is not due yet falls due (a scheduled
	// event's NotBefore, the end of a backoff), and false when there is
	// none. An idle relay sleeps no longer than that, so that scheduled
	// events and retries go out on time instead of at the next poll.
	NextDue func(ctx context.Context) (time.Duration, bool, error)
}

// LeaserConfig is what a relay passes to StoreCapabilities.NewLeaser.
type LeaserConfig struct {
	// PartitionCount is the number of partitions (always > 0).
	PartitionCount int
	// Logger receives the leaser's logs.
	Logger *slog.Logger
}

// ClaimRequest says what a relay asks of Claim.
type ClaimRequest struct {
	// Limit is the maximum number of events to claim; it is always > 0.
	Limit int
	// Ordered, when set, asks for an ordered claim (see OrderedClaim). The
	// relay sets it only on stores whose Capabilities report
	// OrderedClaims.
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

// Stats is a snapshot of the outbox's health.
type Stats struct {
	// Pending counts unpublished, not dead events that are due or in
	// backoff: the relay's backlog. Scheduled events are not counted
	// until their time comes.
	Pending int64
	// OldestPending is when the oldest pending event fell due (its
	// CreatedAt, or its NotBefore for a scheduled event), zero when
	// nothing is pending.
	OldestPending time.Time
	// OldestPendingAge is how long the oldest pending event has waited
	// since it fell due, measured on the database's clock: the lag. A
	// backlog of events scheduled for later is not lag.
	OldestPendingAge time.Duration
	// Scheduled counts events whose NotBefore is still ahead (never
	// attempted, not yet due).
	Scheduled int64
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
	Scheduled        int64
}

// StatsReader is the part of a Store that Monitor reads.
type StatsReader interface {
	Stats(ctx context.Context) (Stats, error)
}

// Cleaner is the part of a Store that Cleanup drives; partitioned tables
// (dialect.PartitionMaintainer) implement it too.
type Cleaner interface {
	// DeletePublished deletes at most limit events published before the
	// given time and returns how many it deleted.
	DeletePublished(ctx context.Context, before time.Time, limit int) (int64, error)
}
