package core

import (
	"context"
	"log/slog"
	"time"
)

// Store is what the relay needs from the database that holds the outbox:
// claims, and what it can do as data.
//
// Claim hands out due events (unpublished, not dead, next attempt reached)
// that no other open claim holds; on PostgreSQL this is SELECT ... FOR UPDATE
// SKIP LOCKED, so concurrent relays never receive the same event while a claim
// is open. The events of a claim stay invisible to other claims until Commit
// or Release. A claim abandoned by a crashed relay (its connection gone) must
// become claimable again.
//
// Everything else a store may do is an optional interface, found by type
// assertion (StoreAs), as database/sql finds what a driver can do:
// StatsReader (the lag monitor), Cleaner (retention), WakeupSource,
// NextDueReader and LeaserSource (used by the relay without wiring). A
// decorator implements Unwrap so that what it does not change is found on
// the store it wraps. The conformance suite (package outboxtest) proves a
// Store, and adapters/memory is the reference implementation.
type Store interface {
	// Claim hands out a batch of due events (see ClaimRequest).
	Claim(ctx context.Context, req ClaimRequest) (Claim, error)
	// Capabilities reports what the store's claims can do. It is constant
	// for the life of the store.
	Capabilities() StoreCapabilities
}

// StoreCapabilities is what a Store's claims can do beyond the unordered
// claim: plain data, which a decorator forwards whole and the relay
// decides from.
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
}

// StatsReader is a Store that reports the outbox's health; Monitor reads
// it.
type StatsReader interface {
	Stats(ctx context.Context) (Stats, error)
}

// Cleaner is a Store that deletes what retention no longer keeps; Cleanup
// drives it, and partitioned tables (dialect.PartitionMaintainer) and the
// archive implement it too.
type Cleaner interface {
	// DeletePublished deletes at most limit events published before the
	// given time and returns how many it deleted. Pending and dead events
	// are never deleted.
	DeletePublished(ctx context.Context, before time.Time, limit int) (int64, error)
}

// WakeupSource is a Store whose adapter notifies a Signal whenever events
// are written through it in this process (its Enqueue, its GORM plugin). A
// relay running on the store subscribes to it, so that a producer's commit
// wakes the relay at once instead of at its next poll, with no wiring by
// the caller. Other processes need a cross-process signal such as package
// pgnotify.
type WakeupSource interface {
	Wakeups() *Signal
}

// NextDueReader is a Store that can tell, by the database's clock, how long
// until the next event that is not due yet falls due (a scheduled event's
// NotBefore, the end of a backoff); ok is false when there is none. An idle
// relay sleeps no longer than that, so that scheduled events and retries go
// out on time instead of at the next poll.
type NextDueReader interface {
	NextDue(ctx context.Context) (d time.Duration, ok bool, err error)
}

// LeaserSource is a Store that builds the PartitionLeaser with which relays
// of one outbox share the partitions of ordered mode. A relay in ordered
// mode on a store whose capabilities report OrderedPartitions uses it
// unless RelayOptions.Ordered names a Leaser or NoLeaser.
type LeaserSource interface {
	NewLeaser(cfg LeaserConfig) (PartitionLeaser, error)
}

// StoreWrapper is a decorator of a Store (package metrics' or tracing's):
// Unwrap returns the store it decorates, on which StoreAs looks for what
// the decorator itself does not implement.
type StoreWrapper interface {
	Unwrap() Store
}

// StoreAs returns the first of s and the stores it wraps (StoreWrapper)
// that implements T, one of the optional interfaces of a Store, and false
// when none does.
func StoreAs[T any](s Store) (T, bool) {
	for s != nil {
		if t, ok := any(s).(T); ok {
			return t, true
		}
		w, ok := s.(StoreWrapper)
		if !ok {
			break
		}
		s = w.Unwrap()
	}
	var zero T
	return zero, false
}

// LeaserConfig is what a relay passes to LeaserSource.NewLeaser.
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
