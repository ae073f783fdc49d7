package memoutbox_test

import (
	"context"
	"fmt"
	"log"
	"time"

	memoutbox "github.com/txoutbox/txoutbox/adapters/memory"
	"github.com/txoutbox/txoutbox/core"
)

// A scheduled event: written in the producer's transaction like any event,
// published no earlier than its NotBefore. Every store does the same; on a
// SQL database the time is compared with the database's clock.
func Example_scheduled() {
	ctx := context.Background()
	store := memoutbox.New(memoutbox.Options{})
	tx := store.Begin()

	// README: scheduled
	reminder, err := core.NewEvent("order", "42", "order.payment_reminder", map[string]string{"order_id": "42"})
	if err != nil {
		log.Fatal(err)
	}
	reminder.NotBefore = time.Now().Add(300 * time.Millisecond) // in a day, in production
	if err := store.Enqueue(ctx, tx, reminder); err != nil {
		log.Fatal(err)
	}
	// README: end
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	stats, err := store.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("scheduled %d, pending %d\n", stats.Scheduled, stats.Pending)

	published := make(chan core.Event, 1)
	relay, err := core.NewRelay(store, core.PublisherFunc(func(_ context.Context, evs []core.Event) error {
		for _, ev := range evs {
			published <- ev
		}
		return nil
	}), core.RelayOptions{PollInterval: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = relay.Run(rctx) }()
	ev := <-published // the relay wakes at the event's time, not at its next poll
	fmt.Println("published", ev.EventType, "on time:", !time.Now().Before(reminder.NotBefore))
	// Output:
	// scheduled 1, pending 0
	// published order.payment_reminder on time: true
}
