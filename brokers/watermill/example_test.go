package watermillbroker_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
)

// Any Watermill publisher plugs into the relay through NewPublisher; here
// the in-process GoChannel.
func ExampleNewPublisher() {
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer ps.Close()
	msgs, _ := ps.Subscribe(context.Background(), "order.created")

	pub := watermillbroker.NewPublisher(ps, watermillbroker.Options{}) // topic = event type
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
