package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	pgxoutbox "github.com/txoutbox/txoutbox/adapters/pgx"
	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
)

// Scenario r compares txoutbox with River (riverqueue/river on pgx), the
// job queue many Go teams use as their outbox: a job inserted in the
// business transaction, a worker that publishes it. River runs twice: at
// its defaults (MaxWorkers 100, the value of River's own examples, as
// River has no default), and tuned for throughput as River's own
// benchmark command sets it (FetchCooldown 2ms, FetchPollInterval 20ms,
// MaxWorkers 2,000). Its worker only counts, as txoutbox's publisher does.

const (
	riverDrainTable = "river_versus"
	riverInsertTx   = 1000 // jobs per InsertManyFastTx transaction
	rProdPlain      = "plain"
	rProdRiver      = "river"
	rProdOutbox     = "txoutbox"
)

// riverJob is the bench's job: the same payload as the outbox's events.
type riverJob struct {
	ID      string          `json:"id"`
	Payload json.RawMessage `json:"payload"`
}

// Kind names the job kind.
func (riverJob) Kind() string { return "bench_order_created" }

// riverCounter is a worker that counts jobs and, when times is set,
// records when each one reached it.
type riverCounter struct {
	river.WorkerDefaults[riverJob]
	n     atomic.Int64
	mu    sync.Mutex
	times map[string]time.Time
}

// Work counts the job.
func (w *riverCounter) Work(_ context.Context, job *river.Job[riverJob]) error {
	if w.times != nil {
		now := time.Now()
		w.mu.Lock()
		w.times[job.Args.ID] = now
		w.mu.Unlock()
	}
	w.n.Add(1)
	return nil
}

// riverSetting is one configuration of River's client.
type riverSetting struct {
	name                         string
	maxWorkers                   int
	fetchCooldown, fetchInterval time.Duration // 0: River's defaults
}

var riverSettings = []riverSetting{
	{name: "defaults", maxWorkers: 100},
	{name: "tuned", maxWorkers: 2000, fetchCooldown: 2 * time.Millisecond, fetchInterval: 20 * time.Millisecond},
}

func (s riverSetting) String() string {
	cd, pi := s.fetchCooldown, s.fetchInterval
	if cd == 0 {
		cd = river.FetchCooldownDefault
	}
	if pi == 0 {
		pi = river.FetchPollIntervalDefault
	}
	return fmt.Sprintf("River %s: MaxWorkers %d, FetchCooldown %s, FetchPollInterval %s", s.name, s.maxWorkers, cd, pi)
}

// client returns a River client of setting s with worker w.
func (s riverSetting) client(pool *pgxpool.Pool, w *riverCounter, log *slog.Logger) (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, w); err != nil {
		return nil, err
	}
	return river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:     s.fetchCooldown,
		FetchPollInterval: s.fetchInterval,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: s.maxWorkers}},
		Workers:           workers,
		Logger:            log,
	})
}

// riverScenario runs scenario r: the drain of an equal backlog, the
// latency at a steady rate, and the producers' cost, River's settings and
// txoutbox taking turns round by round.
func (b *bench) riverScenario(ctx context.Context) ([]row, error) {
	pool, err := b.pgxPool(ctx)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: b.quiet})
	if err != nil {
		return nil, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("river migrate: %w", err)
	}

	if err := b.ensureOrders(ctx); err != nil {
		return nil, err
	}

	// Drain.
	n := b.c.Backlog
	type side struct {
		name  string
		drain func() (float64, error)
	}
	sides := []side{{"txoutbox", func() (float64, error) { return b.relayDrainRate(ctx, riverDrainTable, n) }}}
	for _, s := range riverSettings {
		sides = append(sides, side{s.name, func() (float64, error) { return b.riverDrainRate(ctx, pool, s, n) }})
	}
	drain := rounds{}
	for round := range b.c.Rounds {
		for k := range sides {
			sd := sides[(k+round)%len(sides)]
			r, err := sd.drain()
			if err != nil {
				return nil, fmt.Errorf("drain %s: %w", sd.name, err)
			}
			drain[sd.name] = append(drain[sd.name], r)
		}
		b.log.Info("river drain", "round", round, "txoutbox_per_s", int(drain["txoutbox"][round]),
			"river_defaults_per_s", int(drain["defaults"][round]), "river_tuned_per_s", int(drain["tuned"][round]))
	}

	// Latency at a steady rate: txoutbox's relay woken in process (scenario
	// c's in-process mode), River's client in process as well.
	ours, err := b.latencyRun(ctx, "inproc")
	if err != nil {
		return nil, fmt.Errorf("latency txoutbox: %w", err)
	}
	lat := map[string]latencies{}
	for _, s := range riverSettings {
		if lat[s.name], err = b.riverLatency(ctx, pool, s); err != nil {
			return nil, fmt.Errorf("latency %s: %w", s.name, err)
		}
		b.log.Info("river latency", "setting", s.name, "p50", lat[s.name].p50, "p99", lat[s.name].p99, "txoutbox_p50", ours.p50, "txoutbox_p99", ours.p99)
	}

	// Producers: a business row alone, with River's InsertTx, with
	// txoutbox's Enqueue, each in a pgx.Tx.
	if _, err := b.outbox(ctx, b.db, "river_producers", sqlxoutbox.Options{}); err != nil {
		return nil, err
	}
	box, err := pgxoutbox.New(pool, pgxoutbox.Options{Table: "river_producers", Logger: b.quiet})
	if err != nil {
		return nil, err
	}
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: b.quiet}) // insert only
	if err != nil {
		return nil, err
	}
	_, prod, err := b.rotate(ctx, "river producers", []string{rProdPlain, rProdRiver, rProdOutbox}, func(v string, d time.Duration) (int64, time.Duration, error) {
		return b.produce(ctx, d, func(ctx context.Context, i int) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				switch v {
				case rProdOutbox:
					return producePgx(ctx, box, tx, false, i)
				case rProdRiver:
					if err := insertOrder(ctx, tx, i); err != nil {
						return err
					}
					_, err := inserter.InsertTx(ctx, tx, riverJob{ID: fmt.Sprint(i), Payload: json.RawMessage(orderPayload(i))}, nil)
					return err
				}
				return insertOrder(ctx, tx, i)
			})
		})
	})
	if err != nil {
		return nil, err
	}

	backlog := count(n)
	rate := fmt.Sprintf("%d/s", b.c.LatencyRate)
	var rows []row
	for _, s := range riverSettings {
		r := drain.row(fmt.Sprintf("r  drain of an equal %s backlog, txoutbox (batch %d, %d workers) vs %s (jobs inserted %d per transaction with InsertManyFastTx; the worker only counts)",
			backlog, backlogBatchSize, backlogConcurrency, s, riverInsertTx), "txoutbox", s.name, "—", 0)
		r.unit, r.ratioX = "/s", true
		rows = append(rows, r)
	}
	for _, s := range riverSettings {
		rows = append(rows,
			row{name: "r  latency p50 at " + rate + ", just before COMMIT → publisher or worker, txoutbox in-process wake vs " + s.String(),
				value: ms(ours.p50), baseline: ms(lat[s.name].p50), unit: "ms", target: "—"},
			row{name: "r  latency p99 at " + rate + ", txoutbox vs River " + s.name, value: ms(ours.p99), baseline: ms(lat[s.name].p99), unit: "ms", target: "—"})
	}
	clients := fmt.Sprintf("%d clients, pgx.Tx", b.c.Producers)
	rows = append(rows,
		prod.row("r  producer tx/s, order row + txoutbox Enqueue vs order row + River InsertTx ("+clients+")", rProdOutbox, rProdRiver, "—", 0),
		prod.row("r' producer tx/s, order row + River InsertTx vs the order row alone", rProdRiver, rProdPlain, "—", 0),
		prod.row("r' producer tx/s, order row + txoutbox Enqueue vs the order row alone", rProdOutbox, rProdPlain, "—", 0),
	)
	return rows, nil
}

// insertOrder is the business row of scenario r's producers.
func insertOrder(ctx context.Context, tx pgx.Tx, i int) error {
	_, err := tx.Exec(ctx, orderInsertPG, orderArgs(i, orderPayload(i))...)
	return err
}

// riverDrainRate inserts n jobs, riverInsertTx per transaction, then
// starts a client of setting s and returns the jobs its worker got per
// second from the start until the last one. The client's stop, which
// flushes the last completions, is not timed.
func (b *bench) riverDrainRate(ctx context.Context, pool *pgxpool.Pool, s riverSetting, n int) (float64, error) {
	w := &riverCounter{}
	client, err := s.client(pool, w, b.quiet)
	if err != nil {
		return 0, err
	}
	params := make([]river.InsertManyParams, 0, riverInsertTx)
	for i := 0; i < n; i += riverInsertTx {
		params = params[:0]
		for j := i; j < min(i+riverInsertTx, n); j++ {
			params = append(params, river.InsertManyParams{Args: riverJob{ID: fmt.Sprint(j), Payload: json.RawMessage(orderPayload(j))}})
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := client.InsertManyFastTx(ctx, tx, params)
			return err
		}); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return 0, err
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for w.n.Load() < int64(n) {
		select {
		case <-ctx.Done():
			_ = client.Stop(context.Background())
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
	el := time.Since(start)
	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		return 0, err
	}
	return float64(n) / el.Seconds(), nil
}

// riverWarmUp is how long a started client runs before the latency run.
var riverWarmUp = 3 * time.Second

// riverLatency has the producers commit an order row and its job at
// LatencyRate while a started client of setting s works them; each job's
// latency runs from just before its COMMIT to the moment its worker got
// it, as scenario c's does to the publisher.
func (b *bench) riverLatency(ctx context.Context, pool *pgxpool.Pool, s riverSetting) (latencies, error) {
	w := &riverCounter{times: map[string]time.Time{}}
	client, err := s.client(pool, w, b.quiet)
	if err != nil {
		return latencies{}, err
	}
	if err := client.Start(ctx); err != nil {
		return latencies{}, err
	}
	defer func() { _ = client.Stop(context.Background()) }()
	// Let it finish its start (leader election, first fetch).
	time.Sleep(riverWarmUp)
	run := time.Now().UnixNano()
	ids, committed, _, _, err := b.paced(ctx, func(ctx context.Context, i int) (string, time.Time, error) {
		id := fmt.Sprintf("%d-%d", run, i)
		tx, err := pool.Begin(ctx)
		if err != nil {
			return "", time.Time{}, err
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if err := insertOrder(ctx, tx, i); err != nil {
			return "", time.Time{}, err
		}
		if _, err := client.InsertTx(ctx, tx, riverJob{ID: id, Payload: json.RawMessage(orderPayload(i))}, nil); err != nil {
			return "", time.Time{}, err
		}
		t0 := time.Now()
		return id, t0, tx.Commit(ctx)
	})
	if err != nil {
		return latencies{}, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for w.n.Load() < int64(len(ids)) {
		if time.Now().After(deadline) {
			return latencies{}, fmt.Errorf("%d of %d jobs worked after 30s", w.n.Load(), len(ids))
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	ds := make([]time.Duration, len(ids))
	for i, id := range ids {
		ds[i] = w.times[id].Sub(committed[i])
	}
	b.log.Info("river latency distribution", "p50", percentile(ds, 0.5), "p90", percentile(ds, 0.9), "p95", percentile(ds, 0.95), "p99", percentile(ds, 0.99),
		"p99_after_the_first_second", percentile(ds[min(len(ds), b.c.LatencyRate):], 0.99))
	return latencies{p50: percentile(ds, 0.50), p99: percentile(ds, 0.99)}, nil
}
