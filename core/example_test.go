package core_test

import (
	"fmt"
	"time"

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
