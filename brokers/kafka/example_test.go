package kafkabroker_test

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kfake"

	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	"github.com/txoutbox/txoutbox/core"
)

// A transactional publisher as a log-mode relay uses it: CommittedPosition
// when it starts streaming, then each batch published with the position it
// ends at, in one transaction. (Here the cluster is kfake, in process; give
// a log relay the publisher and it does all of this itself.)
func ExampleNewPublisher_transactional() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		panic(err)
	}
	defer cluster.Close()

	pub, err := kafkabroker.NewPublisher(kafkabroker.Options{
		Brokers:       cluster.ListenAddrs(),
		Transactional: &kafkabroker.Transactional{ID: "txoutbox-orders"},
	})
	if err != nil {
		panic(err) // errors.Is(err, kafkabroker.ErrTransactions): the cluster refuses them
	}
	defer pub.Close()
	fmt.Println("stores positions:", pub.Capabilities().StoresPositions)

	ctx := context.Background()
	pos, err := pub.CommittedPosition(ctx) // fences any earlier relay of this ID
	if err != nil {
		panic(err)
	}
	fmt.Println("position at start:", pos)

	ev, err := core.NewEvent("order", "o-1", "order.created", map[string]int{"total": 42})
	if err != nil {
		panic(err)
	}
	ev.ID = "0193a8a0-0000-7000-8000-000000000001"
	if err := pub.Publish(core.WithPosition(ctx, 1042), []core.Event{ev}); err != nil {
		panic(err)
	}
	pos, err = pub.CommittedPosition(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("position after the batch:", pos)
	// Output:
	// stores positions: true
	// position at start: 0
	// position after the batch: 1042
}
