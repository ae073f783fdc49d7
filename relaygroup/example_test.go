package relaygroup_test

import (
	"context"
	"fmt"
	"log"
	"sync"

	memoutbox "github.com/txoutbox/txoutbox/adapters/memory"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/relaygroup"
)

// One process relays the outboxes of two tenants. With SQL stores each
// member is a core.Relay on its tenant's database (or table); here the
// stores are in memory so that the example runs anywhere.
func Example() {
	var mu sync.Mutex
	got := map[string]int{}
	all := make(chan struct{})
	pub := core.PublisherFunc(func(_ context.Context, evs []core.Event) error {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range evs {
			got[ev.AggregateType]++
		}
		if got["tenant-a"] == 1 && got["tenant-b"] == 1 {
			close(all)
		}
		return nil
	})
	group, err := relaygroup.New(relaygroup.Options{})
	if err != nil {
		log.Fatal(err)
	}
	var members []relaygroup.Member
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		store := memoutbox.New(memoutbox.Options{})
		relay, err := core.NewRelay(store, pub, core.RelayOptions{})
		if err != nil {
			log.Fatal(err)
		}
		members = append(members, relaygroup.Member{Name: tenant, Run: relay.Run})
		ev, err := core.NewEvent(tenant, "1", "order.created", map[string]int{"total": 10})
		if err != nil {
			log.Fatal(err)
		}
		tx := store.Begin()
		if err := store.Enqueue(context.Background(), tx, ev); err != nil {
			log.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			log.Fatal(err)
		}
	}
	if err := group.Set(members); err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- group.Run(ctx) }()
	<-all
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	fmt.Println(got["tenant-a"], got["tenant-b"], len(group.Status()))
	// Output: 1 1 2
}
