package core_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

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

// Any Watermill publisher plugs into the relay through NewWatermillPublisher;
// here the in-process GoChannel.
func ExampleNewWatermillPublisher() {
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer ps.Close()
	msgs, _ := ps.Subscribe(context.Background(), "order.created")

	pub := core.NewWatermillPublisher(ps, nil) // topic = event type
	ev, _ := core.NewEvent("order", "42", "order.created", map[string]any{"total": 9.5})
	ev.ID = "0193a5a8-8f3c-7cc1-9b1e-7f5f2f3c8a11"
	if err := pub.Publish(context.Background(), []core.Event{ev}); err != nil {
		fmt.Println(err)
		return
	}
	m := <-msgs
	m.Ack()
	fmt.Println(m.UUID, m.Metadata.Get(core.HeaderAggregateID), string(m.Payload))
	// Output:
	// 0193a5a8-8f3c-7cc1-9b1e-7f5f2f3c8a11 42 {"total":9.5}
}
