package natsbroker_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsbroker "github.com/txoutbox/txoutbox/brokers/nats"
	"github.com/txoutbox/txoutbox/core"
)

// A publisher for the relay and a subscriber for the consumers, on the
// nats-server at $TXOUTBOX_NATS_URL (make test starts one). The example
// publishes one event as the relay would, reads it back, and deletes its
// stream at the end.
func Example() {
	ctx := context.Background()
	natsURL := os.Getenv("TXOUTBOX_NATS_URL")
	defer deleteStream(natsURL, "ORDERS")

	// README: nats
	// The relay's publisher: JetStream acknowledges every event before the
	// outbox records it; the event ID travels as Nats-Msg-Id, so the stream
	// drops a copy that a restarted relay sends again.
	pub, err := natsbroker.NewPublisher(ctx, natsbroker.Options{
		URL:            natsURL,
		Stream:         "ORDERS",
		StreamSubjects: []string{"order.>"}, // create or update the stream
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	// relay, err := core.NewRelay(store, pub, core.RelayOptions{})

	// The consumers' side: a durable consumer per group and subject, to
	// run under the inbox middleware (inbox.NewMiddleware).
	sub, err := natsbroker.NewSubscriber(natsbroker.SubscriberOptions{URL: natsURL, Stream: "ORDERS", Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "order.created")
	if err != nil {
		log.Fatal(err)
	}
	// README: end

	ev, err := core.NewEvent("order", "o-1", "order.created", map[string]any{"total_cents": 4200})
	if err != nil {
		log.Fatal(err)
	}
	if err := pub.Publish(ctx, []core.Event{ev}); err != nil {
		log.Fatal(err)
	}
	select {
	case msg := <-msgs:
		fmt.Println(msg.UUID == ev.ID, msg.Metadata.Get(core.HeaderEventType), msg.Metadata.Get(core.HeaderAggregateID), string(msg.Payload))
		msg.Ack()
	case <-time.After(10 * time.Second):
		fmt.Println("nothing received")
	}
	// Output: true order.created o-1 {"total_cents":4200}
}

func deleteStream(url, name string) {
	nc, err := nats.Connect(url)
	if err != nil {
		return
	}
	defer nc.Close()
	if js, err := jetstream.New(nc); err == nil {
		_ = js.DeleteStream(context.Background(), name)
	}
}
