package core

import (
	"errors"
	"fmt"
)

// The sentinel errors of txoutbox. Every package of the module wraps these
// (with %w), one per meaning, so that errors.Is tells what went wrong
// whichever adapter or broker reported it.
var (
	// ErrInvalidEvent is wrapped by every error that rejects an event before
	// it is written (see Event.Validate), or that a publisher refuses as
	// one it can never send.
	ErrInvalidEvent = errors.New("txoutbox: invalid event")

	// ErrInvalidOptions is wrapped by errors that reject a configuration.
	ErrInvalidOptions = errors.New("txoutbox: invalid options")

	// ErrNoTransaction is returned (wrapped) by Enqueue and the other write
	// calls of storage adapters when they are not given a transaction: an
	// event written outside the business transaction is exactly the
	// dual-write bug the outbox exists to remove.
	ErrNoTransaction = errors.New("txoutbox: not in a transaction")

	// ErrNotMigrated is returned (wrapped) by stores whose tables do not
	// exist. It does not heal by retrying: Relay.Run returns it instead of
	// retrying, and the CLI names the migration to run.
	ErrNotMigrated = errors.New("txoutbox: outbox table does not exist (run txoutbox migrate, or dialect.Migrate)")

	// ErrUnsupported is returned (wrapped) by a store or publisher asked
	// for something its capabilities do not include.
	ErrUnsupported = errors.New("txoutbox: not supported")

	// ErrClosed is returned (wrapped) by a publisher (or another resource)
	// used after Close.
	ErrClosed = errors.New("txoutbox: closed")

	// ErrPermanent is wrapped by errors made with Permanent.
	ErrPermanent = errors.New("txoutbox: permanent failure")

	// ErrClaimDone is returned by a Claim's Commit or Release once the
	// claim has already been committed or released.
	ErrClaimDone = errors.New("txoutbox: claim already committed or released")

	// ErrInvalidOutcome is returned (wrapped) by a Claim's Commit for an
	// outcome that names an event the claim does not hold, or one event
	// twice. The claim is released.
	ErrInvalidOutcome = errors.New("txoutbox: invalid outcome")

	// ErrEventNotFound is returned (wrapped) by stores asked for an event
	// they do not hold.
	ErrEventNotFound = errors.New("txoutbox: event not found")

	// ErrPublishTimeout is wrapped by the stored error of an event that its
	// publisher had not sent when RelayOptions.PublishTimeout ran out.
	ErrPublishTimeout = errors.New("txoutbox: publish timed out")

	// ErrMissingEventID is returned (wrapped) for a message that carries no
	// event ID, which an inbox cannot deduplicate.
	ErrMissingEventID = errors.New("txoutbox: message has no event_id")

	// ErrOrderedUnsupported is returned (wrapped) by NewRelay when the
	// relay must keep per-aggregate order (OrderingOn, or OrderingAuto with
	// a publisher whose broker keeps it) but the store cannot claim in
	// order: the relay never quietly drops a promise of order.
	ErrOrderedUnsupported = errors.New("txoutbox: store cannot claim events in aggregate order")

	// ErrPartitionCountMismatch is returned (wrapped) by a PartitionLeaser
	// whose partition count differs from the one the relays sharing its
	// outbox use. Every relay of one outbox must use the same count: an
	// aggregate's partition is its hash modulo the count.
	ErrPartitionCountMismatch = errors.New("txoutbox: partition count differs from the other relays'")
)

// Permanent marks err as a failure that retrying cannot cure: an event too
// large for the broker, a header it cannot carry, a topic that does not
// exist or is of the wrong kind. A publisher returns it (alone, or per event
// in a *BatchError), and the relay dead-letters the event at once, with the
// error as its LastError, instead of retrying it for hours. The result
// wraps both ErrPermanent and err. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	if IsPermanent(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrPermanent, err)
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }
