package outboxtest

import (
	"context"
	"errors"
	"testing"
	"time"

	memoutbox "github.com/txoutbox/txoutbox/adapters/memory"
	"github.com/txoutbox/txoutbox/core"
)

// capsStore is the reference store reporting the capabilities it is given
// and a leaser that proves it was reached.
type capsStore struct {
	*memoutbox.Store
	caps core.StoreCapabilities
}

func (s capsStore) Capabilities() core.StoreCapabilities { return s.caps }

func (s capsStore) NewLeaser(core.LeaserConfig) (core.PartitionLeaser, error) {
	return nil, errLeaserProbe
}

// bareStore has the required methods of a Store and nothing else.
type bareStore struct{ core.Store }

var errLeaserProbe = errors.New("outboxtest: the inner store's NewLeaser was called")

// RequireStoreDecorator proves a decorator of core.Store (such as
// metrics.Metrics.Store or tracing.Tracing.Store): the decorated store
// reports the capabilities of the store it wraps, its claims reach that
// store, and core.StoreAs finds on it every optional interface of the
// wrapped store (its wake-up signal, its leaser, its next due time, its
// Stats and DeletePublished) and none that the wrapped store lacks.
func RequireStoreDecorator(t *testing.T, decorate func(core.Store) core.Store) {
	t.Helper()
	ctx := t.Context()
	full := core.StoreCapabilities{OrderedClaims: true, OrderedPartitions: true, MaxConcurrency: 3}
	inner := capsStore{memoutbox.New(memoutbox.Options{}), full}
	d := decorate(inner)
	if got := d.Capabilities(); got != full {
		t.Errorf("decorated store reports %+v, want the wrapped store's %+v", got, full)
	}
	if ws, ok := core.StoreAs[core.WakeupSource](d); !ok || ws.Wakeups() != inner.Wakeups() {
		t.Error("core.StoreAs does not find the wrapped store's wake-up signal on the decorated store")
	}
	if ls, ok := core.StoreAs[core.LeaserSource](d); !ok {
		t.Error("core.StoreAs does not find the wrapped store's leaser on the decorated store")
	} else if _, err := ls.NewLeaser(core.LeaserConfig{PartitionCount: 4}); !errors.Is(err, errLeaserProbe) {
		t.Errorf("the decorated store's NewLeaser did not reach the wrapped store's: %v", err)
	}
	if _, ok := core.StoreAs[core.NextDueReader](d); !ok {
		t.Error("core.StoreAs does not find the wrapped store's NextDue on the decorated store")
	}
	bare := decorate(bareStore{capsStore{memoutbox.New(memoutbox.Options{}), core.StoreCapabilities{}}})
	if z := bare.Capabilities(); z != (core.StoreCapabilities{}) {
		t.Errorf("decorated store without capabilities reports %+v, want none", z)
	}
	if _, ok := core.StoreAs[core.WakeupSource](bare); ok {
		t.Error("a decorated store whose wrapped store has no wake-up signal reports one")
	}
	if _, ok := core.StoreAs[core.LeaserSource](bare); ok {
		t.Error("a decorated store whose wrapped store has no leaser reports one")
	}
	if _, ok := core.StoreAs[core.StatsReader](bare); ok {
		t.Error("a decorated store whose wrapped store has no Stats reports them")
	}

	evs := suiteEvents(t, uniqueType("decorator"), 3, 1)
	tx := inner.Begin()
	if err := inner.Enqueue(ctx, tx, evs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	c, err := d.Claim(ctx, core.ClaimRequest{Limit: 1})
	if err != nil || len(c.Events()) != 1 {
		t.Fatalf("decorated Claim: %v events, %v", c, err)
	}
	if err := c.Commit(ctx, core.Outcome{Published: []int64{c.Events()[0].Seq}}); err != nil {
		t.Fatalf("decorated claim's Commit: %v", err)
	}
	want, err := inner.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sr, ok := core.StoreAs[core.StatsReader](d)
	if !ok {
		t.Fatal("core.StoreAs does not find the wrapped store's Stats on the decorated store")
	}
	st, err := sr.Stats(ctx)
	if err != nil || st.Pending != want.Pending || st.Dead != want.Dead || st.Pending != 2 {
		t.Errorf("decorated Stats = %+v, %v; want the wrapped store's %+v", st, err, want)
	}
	cl, ok := core.StoreAs[core.Cleaner](d)
	if !ok {
		t.Fatal("core.StoreAs does not find the wrapped store's DeletePublished on the decorated store")
	}
	n, err := cl.DeletePublished(ctx, time.Now().Add(time.Hour), 10)
	if err != nil || n != 1 {
		t.Errorf("decorated DeletePublished = %d, %v; want the wrapped store's deletion of 1", n, err)
	}
	if _, err := inner.Get(ctx, c.Events()[0].ID); !errors.Is(err, core.ErrEventNotFound) {
		t.Errorf("the event DeletePublished reported deleted is still in the wrapped store: %v", err)
	}
}

// RequirePublisherDecorator proves a decorator of core.Publisher: the
// decorated publisher reports the capabilities of the one it wraps and
// gains none, and its Publish reaches the wrapped publisher.
func RequirePublisherDecorator(t *testing.T, decorate func(core.Publisher) core.Publisher) {
	t.Helper()
	rec := NewRecorder() // preserves aggregate order
	d := decorate(rec)
	if d.Capabilities() != rec.Capabilities() {
		t.Errorf("decorated publisher reports %+v, want the wrapped one's %+v", d.Capabilities(), rec.Capabilities())
	}
	plain := core.PublisherFunc(func(context.Context, []core.Event) error { return nil })
	if c := decorate(plain).Capabilities(); c != (core.PublisherCapabilities{}) {
		t.Errorf("decorated publisher without capabilities reports %+v, want none", c)
	}
	evs := suiteEvents(t, uniqueType("decorator"), 2, 1)
	if err := d.Publish(t.Context(), evs); err != nil {
		t.Fatalf("decorated Publish: %v", err)
	}
	if rec.Distinct() != 2 {
		t.Errorf("decorated Publish delivered %d of 2 events to the wrapped publisher", rec.Distinct())
	}
}
