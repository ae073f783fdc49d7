package core_test

import (
	"context"
	"testing"

	"github.com/txoutbox/txoutbox/core"
)

type plainStore struct{}

func (plainStore) Claim(context.Context, core.ClaimRequest) (core.Claim, error) { return nil, nil }

type fullStore struct{ plainStore }

func (fullStore) MaxConcurrency() int { return 3 }
func (fullStore) OrderedClaims() bool { return true }

type orderingPub struct{ core.PublisherFunc }

func (orderingPub) PreservesAggregateOrder() bool { return true }

func TestDecorateStoreForwardsOptionalInterfaces(t *testing.T) {
	outer := plainStore{}
	if _, ok := core.DecorateStore(plainStore{}, outer).(core.ConcurrencyLimiter); ok {
		t.Error("decorated plain store is a ConcurrencyLimiter")
	}
	if _, ok := core.DecorateStore(plainStore{}, outer).(core.OrderedStore); ok {
		t.Error("decorated plain store is an OrderedStore")
	}
	d := core.DecorateStore(fullStore{}, outer)
	if l, ok := d.(core.ConcurrencyLimiter); !ok || l.MaxConcurrency() != 3 {
		t.Errorf("decorated store: ConcurrencyLimiter %v", ok)
	}
	if o, ok := d.(core.OrderedStore); !ok || !o.OrderedClaims() {
		t.Errorf("decorated store: OrderedStore %v", ok)
	}
}

func TestDecoratePublisherForwardsOrdering(t *testing.T) {
	outer := core.PublisherFunc(func(context.Context, []core.Event) error { return nil })
	if _, ok := core.DecoratePublisher(outer, outer).(core.OrderingPublisher); ok {
		t.Error("decorated plain publisher is an OrderingPublisher")
	}
	op, ok := core.DecoratePublisher(orderingPub{outer}, outer).(core.OrderingPublisher)
	if !ok || !op.PreservesAggregateOrder() {
		t.Errorf("decorated ordering publisher: OrderingPublisher %v", ok)
	}
}
