package core_test

import (
	"context"
	"fmt"
	"time"

	memoutbox "github.com/txoutbox/txoutbox/adapters/memory"
	"github.com/txoutbox/txoutbox/core"
)

func ExampleRetryPolicy_Backoff() {
	p := core.RetryPolicy{InitialBackoff: time.Second, MaxBackoff: 30 * time.Second, Jitter: -1}
	var waits []time.Duration
	for attempt := 1; attempt <= 7; attempt++ {
		waits = append(waits, p.Backoff(attempt))
	}
	fmt.Println(waits)
	fmt.Println("dead after 25 attempts:", p.Exhausted(25))
	// Output:
	// [1s 2s 4s 8s 16s 30s 30s]
	// dead after 25 attempts: true
}

// loggingStore decorates a store; Unwrap lets the relay and StoreAs find
// what it does not change (the wake-up signal, Stats) on the store beneath.
type loggingStore struct{ core.Store }

func (s loggingStore) Unwrap() core.Store { return s.Store }

func ExampleStoreAs() {
	var store core.Store = loggingStore{memoutbox.New(memoutbox.Options{})}
	if sr, ok := core.StoreAs[core.StatsReader](store); ok {
		st, _ := sr.Stats(context.Background())
		fmt.Println("pending:", st.Pending)
	}
	_, leases := core.StoreAs[core.LeaserSource](store)
	fmt.Println("has a partition leaser:", leases)
	// Output:
	// pending: 0
	// has a partition leaser: false
}
