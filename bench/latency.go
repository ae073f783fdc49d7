package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/pgnotify"
)

// latencies of one mode of scenario c, and the relay's claims per event.
type latencies struct {
	p50, p99       time.Duration
	claimsPerEvent float64
	// The medians of the producers' COMMIT and of the relay's claims: with
	// the spacing of the claims, what the p50 is made of.
	commitP50, claimP50 time.Duration
	// The p99 of the producers' COMMIT (MySQL's rows).
	commitP99 time.Duration
}

// shortCooldown is the relay's MaxCooldown in scenario c's second
// in-process run, the setting for latency first.
const shortCooldown = 2 * time.Millisecond

// latency runs scenario c: producers commit events at a steady rate while
// a relay publishes them, woken in-process, by LISTEN/NOTIFY, or not at all
// (it polls); each event's latency runs from just before its COMMIT is sent
// to the moment the relay hands it to the publisher.
func (b *bench) latency(ctx context.Context) ([]row, error) {
	got := map[string]latencies{}
	for _, mode := range []string{"poll", "inproc", "notify", "inproc_short"} {
		l, err := b.latencyRun(ctx, mode)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", mode, err)
		}
		got[mode] = l
		b.log.Info("latency", "mode", mode, "p50", l.p50, "p99", l.p99, "claims_per_event", l.claimsPerEvent)
	}
	floor, err := b.latencyFloor(ctx)
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	b.log.Info("latency floor", "p50", floor.p50, "p99", floor.p99)
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
		{name: "c' latency p99 at " + rate + ", in-process wake vs the floor (commit → NOTIFY received, same rate)", value: ms(got["inproc"].p99), baseline: ms(floor.p99),
			unit: "ms", ratioX: true, target: "—"},
		{name: "c  relay claims per event at " + rate + ", in-process wake (vs polling every " + pi + ")", value: got["inproc"].claimsPerEvent, baseline: got["poll"].claimsPerEvent,
			unit: "x", ratioX: true, target: "≤ 0.2", pass: got["inproc"].claimsPerEvent <= 0.2, verdict: true},
		{name: "c' latency p50 at " + rate + ", in-process wake, vs the least its claim rate allows here (producer COMMIT p50 + claim p50 + half the time between claims)",
			value: ms(got["inproc"].p50), baseline: ms(p50Bound(got["inproc"], b.c.LatencyRate)), unit: "ms", ratioX: true, target: "—"},
		{name: "c'' latency p50 at " + rate + ", in-process wake, MaxCooldown " + shortCooldown.String() + " (latency first; vs the default " + core.DefaultMaxCooldown.String() + ")",
			value: ms(got["inproc_short"].p50), baseline: ms(got["inproc"].p50), unit: "ms", target: "—"},
		{name: "c'' latency p99 at " + rate + ", in-process wake, MaxCooldown " + shortCooldown.String(),
			value: ms(got["inproc_short"].p99), baseline: ms(got["inproc"].p99), unit: "ms", target: "—"},
		{name: "c'' relay claims per event at " + rate + ", in-process wake, MaxCooldown " + shortCooldown.String(),
			value: got["inproc_short"].claimsPerEvent, baseline: got["inproc"].claimsPerEvent, unit: "x", ratioX: true, target: "—"},
	}, nil
}

// p50Bound is the median latency a relay claiming l.claimsPerEvent times
// per event at rate events/s can reach, given the producers' COMMIT and the
// claim it measured: an event that became visible waits for the next claim,
// on average half the time between two claims, then for the claim itself.
func p50Bound(l latencies, rate int) time.Duration {
	if l.claimsPerEvent <= 0 || rate <= 0 {
		return 0
	}
	between := time.Duration(float64(time.Second) / (float64(rate) * l.claimsPerEvent))
	return l.commitP50 + l.claimP50 + between/2
}

func (b *bench) latencyRun(ctx context.Context, mode string) (latencies, error) {
	table := "latency_" + mode
	// Closed last, after the goroutines below stopped.
	var closeAfter []func() error
	defer func() {
		for _, c := range closeAfter {
			_ = c()
		}
	}()
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

	// The relay's pool: the producers' own in process mode, whose writes
	// wake the relays of their pool; another one otherwise, as another
	// process has, so that only NOTIFY (or the poll) can wake it.
	relayDB := b.db
	if !strings.HasPrefix(mode, "inproc") {
		var err error
		if relayDB, err = b.open(""); err != nil {
			return latencies{}, err
		}
		closeAfter = append(closeAfter, relayDB.Close)
	}
	relayBox, err := b.outbox(ctx, relayDB, table, sqlxoutbox.Options{})
	if err != nil {
		return latencies{}, err
	}
	published := newPublishTimes()
	timed := &timedStore{Store: relayBox}
	ropts := core.RelayOptions{BatchSize: 100, PollInterval: b.c.PollInterval, Cooldown: b.c.Cooldown, Logger: b.log}
	if mode == "inproc_short" {
		ropts.MaxCooldown = max(shortCooldown, b.c.Cooldown)
	}
	relay, err := core.NewRelay(timed, published, ropts)
	if err != nil {
		return latencies{}, err
	}
	var notifier core.Notifier
	switch mode {
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

	ids, committed, commitTook, start, err := b.paced(ctx, func(ctx context.Context, i int) (string, time.Time, error) {
		return b.produceOne(ctx, producer, i)
	})
	if err != nil {
		return latencies{}, err
	}
	total := len(ids)
	if err := published.wait(total, 30*time.Second+2*b.c.PollInterval); err != nil {
		return latencies{}, err
	}
	published.mu.Lock()
	defer published.mu.Unlock()
	// The first 5 % warm connections and caches up.
	var lat []time.Duration
	slow := 0
	for i := total / 20; i < total; i++ {
		d := max(published.at[ids[i]].Sub(committed[i]), 0)
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
	timed.mu.Lock()
	claims := timed.empty + timed.nonEmpty
	claimP50 := percentile(timed.claims, 0.5)
	timed.mu.Unlock()
	return latencies{p50: percentile(lat, 0.50), p99: percentile(lat, 0.99), claimsPerEvent: float64(claims) / float64(total),
		commitP50: percentile(commitTook, 0.5), claimP50: claimP50}, nil
}

// publishTimes is a publisher that records when each event was handed to
// it: the end of a latency measurement.
type publishTimes struct {
	mu sync.Mutex
	at map[string]time.Time
}

func newPublishTimes() *publishTimes { return &publishTimes{at: map[string]time.Time{}} }

func (p *publishTimes) Publish(_ context.Context, evs []core.Event) error {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range evs {
		p.at[evs[i].ID] = now
	}
	return nil
}

func (p *publishTimes) Capabilities() core.PublisherCapabilities { return core.PublisherCapabilities{} }

// wait waits until n distinct events were published, at most d.
func (p *publishTimes) wait(n int, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		p.mu.Lock()
		got := len(p.at)
		p.mu.Unlock()
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d events published", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFor waits until the event id was published, at most d, and returns
// when it was.
func (p *publishTimes) waitFor(id string, d time.Duration) (time.Time, error) {
	deadline := time.Now().Add(d)
	for {
		p.mu.Lock()
		at, ok := p.at[id]
		p.mu.Unlock()
		if ok {
			return at, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("event %s not published in %s", id, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// paced has Producers connections run LatencyFor × LatencyRate
// transactions at LatencyRate, the i-th with tx(ctx, i), which returns an
// ID and the time just before its COMMIT was sent; paced returns those,
// how long each COMMIT took, and when the pace started.
func (b *bench) paced(ctx context.Context, tx func(ctx context.Context, i int) (string, time.Time, error)) (ids []string, committed []time.Time, commitTook []time.Duration, start time.Time, err error) {
	total := int(b.c.LatencyFor.Seconds() * float64(b.c.LatencyRate))
	committed = make([]time.Time, total)
	commitTook = make([]time.Duration, total)
	ids = make([]string, total)
	jobs := make(chan int, total)
	errs := make(chan error, b.c.Producers)
	var wg sync.WaitGroup
	for range b.c.Producers {
		wg.Go(func() {
			for i := range jobs {
				id, t0, err := tx(ctx, i)
				if err != nil {
					errs <- err
					return
				}
				ids[i], committed[i], commitTook[i] = id, t0, time.Since(t0)
			}
		})
	}
	start = b.pace(jobs, total)
	wg.Wait()
	select {
	case err := <-errs:
		return nil, nil, nil, start, err
	default:
	}
	return ids, committed, commitTook, start, nil
}

// latencyFloor measures what any relay woken by commits is bounded by on
// this machine at this moment: producers at the same rate commit a
// transaction that sends a NOTIFY, and a listener on its own connection
// records when each arrives; the latency runs from just before COMMIT, as
// scenario c's does.
func (b *bench) latencyFloor(ctx context.Context) (latencies, error) {
	const channel = "txoutbox_bench_floor"
	conn, err := pgx.Connect(ctx, b.dsn)
	if err != nil {
		return latencies{}, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		return latencies{}, err
	}
	total := int(b.c.LatencyFor.Seconds() * float64(b.c.LatencyRate))
	var mu sync.Mutex
	received := make(map[string]time.Time, total)
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	listenDone := make(chan struct{})
	go func() {
		defer close(listenDone)
		for {
			n, err := conn.WaitForNotification(lctx)
			if err != nil {
				return
			}
			now := time.Now()
			mu.Lock()
			received[n.Payload] = now
			mu.Unlock()
		}
	}()
	ids, committed, _, _, err := b.paced(ctx, func(ctx context.Context, i int) (string, time.Time, error) {
		id := fmt.Sprint(i)
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			return "", time.Time{}, err
		}
		if _, err := tx.ExecContext(ctx, "SELECT pg_notify($1, $2)", channel, id); err != nil {
			_ = tx.Rollback()
			return "", time.Time{}, err
		}
		t0 := time.Now()
		return id, t0, tx.Commit()
	})
	if err != nil {
		return latencies{}, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(received)
		mu.Unlock()
		if n >= total || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-listenDone
	var lat []time.Duration
	for i := total / 20; i < total; i++ {
		if at, ok := received[ids[i]]; ok {
			lat = append(lat, max(at.Sub(committed[i]), 0))
		}
	}
	if len(lat) < total*9/10 {
		return latencies{}, fmt.Errorf("only %d of %d notifications received", len(lat), total)
	}
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

// pace sends 0..total-1 to jobs at LatencyRate, steadily: job i is due at
// start + i/rate, and a late producer catches up without sleeping, as a
// real arrival process would not wait. It closes jobs and returns start.
func (b *bench) pace(jobs chan<- int, total int) time.Time {
	interval := time.Second / time.Duration(b.c.LatencyRate)
	start := time.Now()
	for i := range total {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		jobs <- i
	}
	close(jobs)
	return start
}
