package faultmatrix_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/tier"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// Log mode into Kafka with ?transactional=true: while producers commit
// events, the relay process is SIGKILLed and started again 10 times, the broker's connections are reset once and the database is
// crashed and started once (PostgreSQL's slot then goes back to its last
// checkpoint and sends recent changes again). A consumer that reads with
// isolation.level=read_committed, and no inbox, sees every event exactly
// once and each aggregate's events in order. The same run without the
// option kills until the consumer has seen a duplicate (at most 10
// kills): it shows that the check can fail.
func TestExactlyOnceIntoKafka(t *testing.T) {
	tier.SkipShort(t)
	t.Parallel()
	type run struct {
		name string
		be   backend
		tx   bool
	}
	runs := []run{
		{"PostgreSQL", backendLog, true},
		{"MariaDB", backendBinlog, true},
		{"PostgreSQL_without_transactions", backendLog, false},
	}
	if long {
		runs = append(runs, run{"MariaDB_without_transactions", backendBinlog, false})
	}
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			exactlyOnceRun(t, r.be, r.tx)
		})
	}
}

// eosRecord is one record as the consumer read it.
type eosRecord struct {
	id, agg string
	n       int
}

func exactlyOnceRun(t *testing.T, be backend, transactional bool) {
	c := &cell{ordering: "on", backend: be}
	if be == backendBinlog {
		c.server = testenv.StartMariaDB(t)
	} else {
		c.server = testenv.StartCluster(t)
	}
	fx := c.store(t)
	c.kafka(t)
	if transactional {
		c.brokerURL += "?transactional=true"
	}
	c.startRelay(t)

	const topic = "eos.orders"
	const aggregates = 7
	// The consumer: every partition from the start, committed records only.
	cons, err := kgo.NewClient(kgo.SeedBrokers(c.kfake.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cons.Close)
	var mu sync.Mutex
	var got []eosRecord
	cctx, stopConsumer := context.WithCancel(context.Background())
	consumerDone := make(chan struct{})
	go func() {
		defer close(consumerDone)
		for cctx.Err() == nil {
			fs := cons.PollFetches(cctx)
			fs.EachRecord(func(rec *kgo.Record) {
				r := eosRecord{agg: string(rec.Key)}
				for _, h := range rec.Headers {
					if h.Key == core.HeaderEventID {
						r.id = string(h.Value)
					}
				}
				var p struct{ N int }
				_ = json.Unmarshal(rec.Value, &p)
				r.n = p.N
				mu.Lock()
				got = append(got, r)
				mu.Unlock()
			})
		}
	}()
	t.Cleanup(func() { stopConsumer(); <-consumerDone })

	// One producer, one event per transaction, the aggregates in turn: an
	// aggregate's events commit in the order of their n. An enqueue that
	// failed (the crash) may or may not have committed.
	var produced atomic.Int64
	committed := map[string]bool{} // ID -> surely committed
	var prodMu sync.Mutex
	stopProducing := make(chan struct{})
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		tick := time.NewTicker(4 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stopProducing:
				return
			case <-tick.C:
			}
			ev, err := core.NewEvent("order", fmt.Sprintf("o-%d", i%aggregates), topic, map[string]int{"n": i})
			if err != nil {
				panic(err)
			}
			ev.ID = uuid.Must(uuid.NewV7()).String()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = fx.Enqueue(ctx, []core.Event{ev}, true)
			cancel()
			prodMu.Lock()
			committed[ev.ID] = err == nil
			prodMu.Unlock()
			if err != nil {
				time.Sleep(50 * time.Millisecond) // the database is down
				continue
			}
			produced.Add(1)
		}
	}()

	// The faults, counted in events rather than seconds (a loaded machine
	// produces slower): a kill every 150-250 events; the broker's
	// connections reset before the 4th, the database crashed before the
	// 7th.
	const maxKills = 10
	received := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}
	duplicated := func() bool {
		mu.Lock()
		defer mu.Unlock()
		seen := make(map[string]bool, len(got))
		for _, r := range got {
			if seen[r.id] {
				return true
			}
			seen[r.id] = true
		}
		return false
	}
	kills := 0
	for k := range maxKills {
		if !transactional && duplicated() {
			// The run without the option has shown what it is for: the
			// check below can fail.
			break
		}
		at := produced.Load() + 150 + time.Now().UnixNano()%100
		wait.For(t, fmt.Sprintf("%d events produced before kill %d", at, k+1), func() (bool, any) {
			return produced.Load() >= at, fmt.Sprintf("%d produced, %d received", produced.Load(), received())
		})
		switch k {
		case 3:
			if err := c.broker.Reset(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			if err := c.broker.Heal(); err != nil {
				t.Fatal(err)
			}
		case 6:
			crashMu.Lock()
			c.server.Crash(t)
			time.Sleep(time.Second)
			c.server.Start(t)
			crashMu.Unlock()
		}
		c.killRelay(t)
		c.startRelay(t)
		kills++
	}
	close(stopProducing)
	<-prodDone

	prodMu.Lock()
	var sure []string
	for id, ok := range committed {
		if ok {
			sure = append(sure, id)
		}
	}
	prodMu.Unlock()
	// Every committed event out.
	wait.For(t, "every committed event at the consumer", func() (bool, any) {
		mu.Lock()
		defer mu.Unlock()
		seen := make(map[string]bool, len(got))
		for _, r := range got {
			seen[r.id] = true
		}
		missing := 0
		for _, id := range sure {
			if !seen[id] {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d committed events missing (%d records read)", missing, len(sure), len(got))
	})

	mu.Lock()
	defer mu.Unlock()
	count := map[string]int{}
	dups, reordered, phantom := 0, 0, 0
	last := map[string]int{}
	for _, r := range got {
		count[r.id]++
		if count[r.id] > 1 {
			dups++
			continue
		}
		if _, ok := committed[r.id]; !ok {
			phantom++
		}
		if n, ok := last[r.agg]; ok && r.n < n {
			reordered++
		}
		last[r.agg] = r.n
	}
	t.Logf("transactional=%v: %d events committed (%d more uncertain), %d kills, %d records read: %d duplicates, %d reordered, %d phantom",
		transactional, len(sure), len(committed)-len(sure), kills, len(got), dups, reordered, phantom)
	if reordered > 0 || phantom > 0 {
		t.Errorf("%d events reordered within their aggregate, %d records of no produced event", reordered, phantom)
	}
	if transactional && dups > 0 {
		t.Errorf("%d duplicates reached a read_committed consumer with ?transactional=true", dups)
	}
	if !transactional && dups == 0 {
		t.Errorf("no duplicate after %d kills without transactions: this run cannot show that the transactional one prevents them", kills)
	}
}
