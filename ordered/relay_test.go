package ordered_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/ordered"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// Three relays with leasers, a publisher failing 10 % of events, relays
// leaving and joining while events are written: everything arrives, and
// every aggregate's first deliveries are in order.
func TestOrderedRelaysKeepAggregateOrder(t *testing.T) {
	t.Parallel()
	forDialects(t, func(t *testing.T, d dialect.Dialect) {
		db := migrated(t, d)
		rec := outboxtest.NewRecorder()
		faulty := &outboxtest.Faulty{Inner: rec, FailRate: 0.1, FailAfterSendRate: 0.02}
		const n = 12
		start := func(name string) (stop func(), l *ordered.Leaser) {
			l, err := ordered.NewLeaser(db, d, ordered.LeaserOptions{
				Owner: name, PartitionCount: n, LeaseTTL: time.Second, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			r, err := core.NewRelay(newStore(t, db, d), faulty, core.RelayOptions{
				BatchSize: 50, Concurrency: 2, PollInterval: 20 * time.Millisecond,
				Retry:    core.RetryPolicy{InitialBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, MaxAttempts: 1000},
				Ordering: core.OrderingOn,
				Ordered:  core.OrderedOptions{Leaser: l},
				Logger:   testLogger(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			return func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("relay %s: %v", name, err)
				}
			}, l
		}
		stopA, _ := start("a")
		stopB, _ := start("b")
		stopC, _ := start("c")

		aggs := aggNames(60)
		all := events(aggs, 50) // 3000
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < len(all); i += 300 {
				enqueue(t, db, d, all[i:i+300])
				time.Sleep(50 * time.Millisecond)
			}
		}()
		time.Sleep(300 * time.Millisecond)
		stopB() // leaves: a and c take over its partitions
		time.Sleep(300 * time.Millisecond)
		stopB, _ = start("b2") // joins: partitions rebalance
		wg.Wait()

		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := rec.WaitDistinct(ctx, len(all)); err != nil {
			t.Fatalf("%d of %d events published: %v", rec.Distinct(), len(all), err)
		}
		stopA()
		stopB()
		stopC()
		got := rec.Events()
		dups, err := checkFirstDeliveryOrder(got)
		if err != nil {
			t.Fatal(err)
		}
		fc := faulty.Counts()
		if fc.Refused == 0 {
			t.Fatal("no fault injected: the test proves nothing")
		}
		t.Logf("delivered %d distinct, %d duplicates, faults %+v", rec.Distinct(), dups, fc)
	})
}
