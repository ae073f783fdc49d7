package outboxtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/txoutbox/txoutbox/core"
)

// StoreFixture is a fresh, migrated, empty outbox on a real database, made
// for one subtest. Package sqlfixture builds one on the txoutbox schema for
// every database txoutbox supports, for a store of your own on it.
type StoreFixture struct {
	// Store is the store under test. Its Capabilities decide what the
	// suite checks (ordered claims, concurrency, wake-up).
	Store core.Store
	// Enqueue writes events (their IDs already set) in one transaction
	// together with a business row, then commits, or rolls back when commit
	// is false. It must return only after the commit or rollback.
	Enqueue func(ctx context.Context, events []core.Event, commit bool) error
	// EnqueueThenCommit writes a business row, then tries to enqueue
	// events in the same transaction, then commits whatever the enqueue
	// returned, and reports both errors: for invalid events the suite
	// expects the enqueue to fail and the commit to succeed.
	EnqueueThenCommit func(ctx context.Context, events []core.Event) (enqueueErr, commitErr error)
	// Get returns the stored event with the given ID, with its delivery
	// bookkeeping (PublishedAt, AttemptCount, LastError, DeadAt), or an
	// error wrapping core.ErrEventNotFound.
	Get func(ctx context.Context, id string) (core.Event, error)
	// Backdate moves the event's timestamps (created_at, published_at,
	// next_attempt_at, dead_at) back by age, so that retention, lag and the
	// end of a backoff can be tested without waiting.
	Backdate func(ctx context.Context, id string, age time.Duration) error
	// RetryDead re-queues the dead event with the given ID, with a fresh
	// budget of attempts, due now. RunOrderedStore needs it.
	RetryDead func(ctx context.Context, id string) error
	// Crash abandons every open claim of Store as the death of the relay's
	// process does, without Commit or Release: on a database, it kills
	// the connections the claims run on. Their events must then become
	// claimable again within ClaimLease.
	Crash func(ctx context.Context) error
	// ClaimLease bounds how long after Crash the abandoned events become
	// claimable again: 0 for stores whose claims end with their
	// connection (PostgreSQL), the lease for stores that lease rows
	// (SQLite). Keep it short in fixtures.
	ClaimLease time.Duration
	// NewRelay, when set, builds the relay that RunEndToEnd, RunExactlyOnce
	// and RunFault run, in place of core.NewRelay on Store: a relay of
	// another mode, such as log mode (package logrelay), whose retry path
	// is Store.
	NewRelay func(pub core.Publisher, opts core.RelayOptions) (Relay, error)
	// Settled, for relays that keep no row per published event (log
	// mode), returns nil once every event committed before the call was
	// delivered or handed to the retry path, and an error when ctx ends
	// first. The suites then check it in place of each event's
	// PublishedAt.
	Settled func(ctx context.Context) error
}

// Relay is what the suites need of a relay: core.Relay, or a relay of
// another mode (StoreFixture.NewRelay).
type Relay interface {
	// Run relays until ctx ends.
	Run(ctx context.Context) error
	// Ordered reports whether the relay keeps per-aggregate order.
	Ordered() bool
}

// NewStoreFunc makes a StoreFixture for one subtest. It registers its own
// cleanup with t.Cleanup.
type NewStoreFunc func(t *testing.T) *StoreFixture

// BrokerFixture is a publisher and a subscriber on one real broker, made for
// one subtest. What the suite checks of the broker's order follows the
// publisher's Capabilities.
type BrokerFixture struct {
	// Publisher is the publisher under test.
	Publisher core.Publisher
	// Subscriber reads what Publisher sent. The suite subscribes before it
	// publishes, acks every message, and closes the subscription when the
	// test ends: a subscription that does not close fails the test.
	Subscriber message.Subscriber
	// Topic maps an event type to the topic to subscribe to. Default: the
	// event type itself.
	Topic func(eventType string) string
	// Poison returns a copy of ev that the broker can never carry (too
	// large, a header it refuses), for the "poison in a batch" check: the
	// publisher must fail that event alone, permanently. Default: ev with
	// a header key of 300 bytes, which AMQP and SNS refuse; brokers that
	// take such a key (Kafka) must supply their own.
	Poison func(ev core.Event) core.Event
	// DeliveryTimeout bounds how long the suite waits for messages to
	// arrive. Default 15s, or the TXOUTBOX_TEST_DELIVERY_TIMEOUT
	// environment variable (a Go duration) when set: raise it for a remote
	// broker. RunExactlyOnce waits for its effects as long as they keep
	// landing, up to four times this, and gives up after this long with
	// none.
	DeliveryTimeout time.Duration
	// Stop and Start take the broker down and bring it back, for the outage
	// test; leave both nil if the fixture cannot.
	Stop, Start func(t *testing.T)
}

// NewBrokerFunc makes a BrokerFixture for one subtest.
type NewBrokerFunc func(t *testing.T) *BrokerFixture

func (b *BrokerFixture) topic(eventType string) string {
	if b.Topic != nil {
		return b.Topic(eventType)
	}
	return eventType
}

// DefaultDeliveryTimeout is BrokerFixture.DeliveryTimeout's default: how
// long the suite's waits for deliveries and effects may see no progress
// before they fail. A wait that keeps making progress is never cut short,
// so a loaded machine makes a case slower, not red.
const DefaultDeliveryTimeout = time.Minute

// deliveryTimeout returns how long to wait for deliveries from b.
func (b *BrokerFixture) deliveryTimeout(t testing.TB) time.Duration {
	if b != nil && b.DeliveryTimeout > 0 {
		return b.DeliveryTimeout
	}
	return envDeliveryTimeout(t)
}

func envDeliveryTimeout(t testing.TB) time.Duration {
	if v := os.Getenv("TXOUTBOX_TEST_DELIVERY_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("TXOUTBOX_TEST_DELIVERY_TIMEOUT=%q: want a positive Go duration such as 30s", v)
		}
		return d
	}
	return DefaultDeliveryTimeout
}

// poison returns the event b cannot carry.
func (b *BrokerFixture) poison(ev core.Event) core.Event {
	if b.Poison != nil {
		return b.Poison(ev)
	}
	ev.Headers = map[string]string{strings.Repeat("k", 300): "v"}
	return ev
}

// suiteEvents makes n events of one event type over aggs aggregates, with
// their IDs set and a custom header, as the suite's producers write them.
func suiteEvents(t testing.TB, eventType string, n, aggs int) []core.Event {
	t.Helper()
	evs := make([]core.Event, n)
	for i := range evs {
		agg := fmt.Sprintf("agg-%d", i%max(aggs, 1))
		ev, err := core.NewEvent("suite", agg, eventType, map[string]any{"n": i, "agg": agg})
		if err != nil {
			t.Fatal(err)
		}
		ev.ID = uuid.Must(uuid.NewV7()).String()
		ev.Headers = map[string]string{"suite-header": fmt.Sprintf("h-%d", i)}
		evs[i] = ev
	}
	return evs
}

// uniqueType returns an event type no other subtest uses, so that topics,
// queues and consumer groups on a shared broker never mix.
func uniqueType(name string) string {
	return "suite." + name + "." + uuid.NewString()[:8]
}

func ids(evs []core.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.ID
	}
	return out
}
