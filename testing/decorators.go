package outboxtest

import (
	"context"
	"errors"
	"testing"
	"time"

	memoutbox "github.com/txoutbox/txoutbox/adapters/memory"
	"github.com/txoutbox/txoutbox/core"
)

// capsStore is the reference store reporting the capabilities it is given.
type capsStore struct {
	*memoutbox.Store
	caps core.StoreCapabilities
}

func (s capsStore) Capabilities() core.StoreCapabilities { return s.caps }

var errLeaserProbe = errors.New("outboxtest: the inner store's NewLeaser was called")

// RequireStoreDecorator proves a decorator of core.Store (such as
// metrics.Metrics.Store or tracing.Tracing.Store): the decorated store
// reports every capability of the store it wraps and gains none, and its
// claims, Stats and DeletePublished reach the wrapped store.
func RequireStoreDecorator(t *testing.T, decorate func(core.Store) core.Store) {
	t.Helper()
	ctx := t.Context()
	sig := &core.Signal{}
	full := core.StoreCapabilities{
		OrderedClaims:     true,
		OrderedPartitions: true,
		MaxConcurrency:    3,
		Wakeups:           sig,
		NewLeaser: func(core.LeaserConfig) (core.PartitionLeaser, error) {
			return nil, errLeaserProbe
		},
	}
	inner := capsStore{memoutbox.New(memoutbox.Options{}), full}
	d := decorate(inner)
	got := d.Capabilities()
	if got.OrderedClaims != full.OrderedClaims || got.OrderedPartitions != full.OrderedPartitions ||
		got.MaxConcurrency != full.MaxConcurrency || got.Wakeups != sig {
		t.Errorf("decorated store reports %+v, want the wrapped store's %+v", got, full)
	}
	if got.NewLeaser == nil {
		t.Error("decorated store lost NewLeaser")
	} else if _, err := got.NewLeaser(core.LeaserConfig{PartitionCount: 4}); !errors.Is(err, errLeaserProbe) {
		t.Errorf("decorated store's NewLeaser did not reach the wrapped store's: %v", err)
	}
	if z := decorate(capsStore{memoutbox.New(memoutbox.Options{}), core.StoreCapabilities{}}).Capabilities(); z.OrderedClaims || z.OrderedPartitions || z.MaxConcurrency != 0 || z.Wakeups != nil || z.NewLeaser != nil {
		t.Errorf("decorated store without capabilities reports %+v, want none", z)
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
	st, err := d.Stats(ctx)
	if err != nil || st.Pending != want.Pending || st.Dead != want.Dead || st.Pending != 2 {
		t.Errorf("decorated Stats = %+v, %v; want the wrapped store's %+v", st, err, want)
	}
	n, err := d.DeletePublished(ctx, time.Now().Add(time.Hour), 10)
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
