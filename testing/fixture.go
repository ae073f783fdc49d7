package outboxtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/txoutbox/txoutbox/core"
)

// StoreFixture is a fresh, migrated, empty outbox on a real database, made
// for one subtest.
type StoreFixture struct {
	// Store is the store under test.
	Store core.Store
	// Enqueue writes events (their IDs already set) in one transaction
	// together with a business row, then commits, or rolls back when commit
	// is false. It must return only after the commit or rollback.
	Enqueue func(ctx context.Context, events []core.Event, commit bool) error
	// Get returns the stored event with the given ID, with its delivery
	// bookkeeping (PublishedAt, AttemptCount, LastError, DeadAt).
	Get func(ctx context.Context, id string) (core.Event, error)
	// Backdate moves the event's created_at and published_at back by age,
	// so that retention and lag can be tested without waiting.
	Backdate func(ctx context.Context, id string, age time.Duration) error
	// Stats and Cleaner are usually the Store itself.
	Stats   core.StatsReader
	Cleaner core.Cleaner
	// ConcurrentClaims says that two open claims never share an event, so
	// that several relays may run at once (PostgreSQL: yes; SQLite: no).
	ConcurrentClaims bool
}

// NewStoreFunc makes a StoreFixture for one subtest. It registers its own
// cleanup with t.Cleanup.
type NewStoreFunc func(t *testing.T) *StoreFixture

// BrokerFixture is a publisher and a subscriber on one real broker, made for
// one subtest.
type BrokerFixture struct {
	// Publisher is the publisher under test.
	Publisher core.Publisher
	// Subscriber reads what Publisher sent. The suite subscribes before it
	// publishes, and acks every message.
	Subscriber message.Subscriber
	// Topic maps an event type to the topic to subscribe to. Default: the
	// event type itself.
	Topic func(eventType string) string
	// Ordered says the broker keeps the order of one aggregate's events.
	Ordered bool
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

// Tuning of the suite; generous, because CI machines are shared.
const (
	deliveryTimeout = 60 * time.Second
)

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

func timeout(t *testing.T, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), d)
}
