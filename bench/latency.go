package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/pgnotify"
)

// latencies of one mode of scenario c.
type latencies struct{ p50, p99 time.Duration }

// latency runs scenario c: producers commit events at a steady rate while
// a relay publishes them, woken in-process, by LISTEN/NOTIFY, or not at all
// (it polls); each event's latency runs from just before its COMMIT is sent
// to the moment the relay hands it to the publisher.
func (b *bench) latency(ctx context.Context) ([]row, error) {
	got := map[string]latencies{}
	for _, mode := range []string{"poll", "inproc", "notify"} {
		l, err := b.latencyRun(ctx, mode)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", mode, err)
		}
		got[mode] = l
		b.log.Info("latency", "mode", mode, "p50", l.p50, "p99", l.p99)
	}
	poll := got["poll"]
	poll50, poll99 := ms(poll.p50), ms(poll.p99)
	mk := func(name string, v, base, limit float64) row {
		return row{name: name, value: v, baseline: base, unit: "ms", target: fmt.Sprintf("≤ %.0f ms", limit), pass: v <= limit, verdict: true}
	}
	rate := fmt.Sprintf("%d/s", b.c.LatencyRate)
	pi := b.c.PollInterval.String()
	return []row{
		mk("c  latency p50 at "+rate+", in-process wake (vs poll "+pi+")", ms(got["inproc"].p50), poll50, 3),
		mk("c  latency p99 at "+rate+", in-process wake (vs poll "+pi+")", ms(got["inproc"].p99), poll99, 10),
		mk("c  latency p50 at "+rate+", LISTEN/NOTIFY, 1-4 ms debounce (vs poll "+pi+")", ms(got["notify"].p50), poll50, 3),
		mk("c  latency p99 at "+rate+", LISTEN/NOTIFY, 1-4 ms debounce (vs poll "+pi+")", ms(got["notify"].p99), poll99, 10),
	}, nil
}

func (b *bench) latencyRun(ctx context.Context, mode string) (latencies, error) {
	table := "latency_" + mode
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	goRun := func(fn func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = fn(ctx)
		}()
	}

	relayBox, err := b.outbox(ctx, b.db, table, sqlxoutbox.Options{})
	if err != nil {
		return latencies{}, err
	}
	var mu sync.Mutex
	published := map[string]time.Time{}
	pub := core.PublisherFunc(func(_ context.Context, evs []core.Event) error {
		now := time.Now()
		mu.Lock()
		for i := range evs {
			published[evs[i].ID] = now
		}
		mu.Unlock()
		return nil
	})
	timed := &timedStore{Store: relayBox}
	relay, err := core.NewRelay(timed, pub, core.RelayOptions{BatchSize: 100, PollInterval: b.c.PollInterval, Cooldown: b.c.Cooldown, Logger: b.log})
	if err != nil {
		return latencies{}, err
	}
	var notifier core.Notifier
	switch mode {
	case "inproc":
		notifier = relay
	case "notify":
		n, err := pgnotify.NewNotifier(b.dsn, pgnotify.NotifierOptions{Channel: table, Logger: b.quiet})
		if err != nil {
			return latencies{}, err
		}
		l, err := pgnotify.NewListener(b.dsn, relay, pgnotify.ListenerOptions{Channel: table, Logger: b.quiet})
		if err != nil {
			return latencies{}, err
		}
		goRun(n.Run)
		goRun(l.Run)
		defer func() {
			b.log.Info("notify stats", "notifier", n.Stats(), "listener", l.Stats())
		}()
		select {
		case <-l.Ready():
		case <-time.After(30 * time.Second):
			return latencies{}, fmt.Errorf("listener did not connect")
		}
		notifier = n
	}
	producer, err := b.outbox(ctx, b.db, table, sqlxoutbox.Options{Notifier: notifier})
	if err != nil {
		return latencies{}, err
	}
	goRun(relay.Run)

	total := int(b.c.LatencyFor.Seconds() * float64(b.c.LatencyRate))
	committed := make([]time.Time, total)
	commitTook := make([]time.Duration, total)
	ids := make([]string, total)
	jobs := make(chan int, total)
	errs := make(chan error, b.c.Producers)
	var pwg sync.WaitGroup
	for range b.c.Producers {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			for i := range jobs {
				id, t0, err := b.produceOne(ctx, producer, i)
				if err != nil {
					errs <- err
					return
				}
				ids[i], committed[i], commitTook[i] = id, t0, time.Since(t0)
			}
		}()
	}
	// A steady pace: event i is due at start + i/rate; a late producer
	// catches up without sleeping, as a real arrival process would not wait.
	interval := time.Second / time.Duration(b.c.LatencyRate)
	start := time.Now()
	for i := range total {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		jobs <- i
	}
	close(jobs)
	pwg.Wait()
	select {
	case err := <-errs:
		return latencies{}, err
	default:
	}
	deadline := time.Now().Add(30*time.Second + 2*b.c.PollInterval)
	for {
		mu.Lock()
		n := len(published)
		mu.Unlock()
		if n >= total {
			break
		}
		if time.Now().After(deadline) {
			return latencies{}, fmt.Errorf("only %d of %d events published", n, total)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	// The first 5 % warm connections and caches up.
	var lat []time.Duration
	slow := 0
	for i := total / 20; i < total; i++ {
		d := max(published[ids[i]].Sub(committed[i]), 0)
		lat = append(lat, d)
		if d > b.c.PollInterval/4 {
			slow++
			if os.Getenv("BENCH_DEBUG") != "" {
				b.log.Info("slow event", "mode", mode, "i", i, "at", committed[i].Sub(start), "latency", d)
			}
		}
	}
	b.log.Info("latency run", append([]any{"mode", mode, "events", len(lat), "slower_than_quarter_poll", slow,
		"producer_commit_p50", percentile(commitTook, 0.5), "producer_commit_p99", percentile(commitTook, 0.99)}, timed.summary()...)...)
	return latencies{p50: percentile(lat, 0.50), p99: percentile(lat, 0.99)}, nil
}

// produceOne commits one event in a transaction of its own and returns its
// ID and the time just before COMMIT was sent.
func (b *bench) produceOne(ctx context.Context, box *sqlxoutbox.Outbox, i int) (string, time.Time, error) {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return "", time.Time{}, err
	}
	evs := []core.Event{{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%1000), EventType: "order.created", Payload: []byte(orderPayload(i))}}
	if err := box.Enqueue(ctx, tx, evs...); err != nil {
		_ = tx.Rollback()
		return "", time.Time{}, err
	}
	t0 := time.Now()
	if err := tx.Commit(); err != nil {
		return "", time.Time{}, err
	}
	return evs[0].ID, t0, nil
}
