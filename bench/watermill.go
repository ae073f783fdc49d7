package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
)

// countingPublisher is the forwarder's destination: an in-memory broker
// that accepts every message, like the relay's memPublisher.
type countingPublisher struct{ n atomic.Int64 }

func (p *countingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.n.Add(int64(len(msgs)))
	return nil
}

func (p *countingPublisher) Close() error { return nil }

// watermill runs scenario b's baseline: Watermill's outbox, i.e. the SQL
// publisher wrapped by the forwarder's envelope publisher on the producer
// side, and the forwarder (SQL subscriber + router) draining the backlog to
// an in-memory publisher. Everything is left at Watermill's defaults
// (SubscribeBatchSize 100, the default offsets adapter) but the idle poll,
// which the backlog never waits for anyway.
//
// batch is SubscribeBatchSize (0: Watermill's default, 100) and n the
// number of messages; tag names the call's topic, a table of its own, so
// that every call starts from an empty one.
func (b *bench) watermill(ctx context.Context, batch, n int, tag string) (float64, error) {
	wmForwarderTopic := fmt.Sprintf("txoutbox_bench_forwarder_%d_%s", batch, tag)
	schema := wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: batch}
	beginner := wmsql.BeginnerFromStdSQL(b.db)
	logger := watermill.NopLogger{}
	sqlPub, err := wmsql.NewPublisher(beginner, wmsql.PublisherConfig{
		SchemaAdapter:        schema,
		AutoInitializeSchema: true,
	}, logger)
	if err != nil {
		return 0, err
	}
	pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: wmForwarderTopic})
	const chunk = 500
	for i := 0; i < n; i += chunk {
		msgs := make([]*message.Message, 0, chunk)
		for j := i; j < min(i+chunk, n); j++ {
			m := message.NewMessage(watermill.NewUUID(), []byte(orderPayload(j)))
			m.Metadata.Set("aggregate_id", fmt.Sprintf("o-%d", j%1000))
			msgs = append(msgs, m)
		}
		if err := pub.Publish("orders", msgs...); err != nil {
			return 0, fmt.Errorf("write the Watermill backlog: %w", err)
		}
	}
	if _, err := b.db.ExecContext(ctx, `VACUUM ANALYZE "watermill_`+wmForwarderTopic+`"`); err != nil {
		return 0, err
	}

	sub, err := wmsql.NewSubscriber(beginner, wmsql.SubscriberConfig{
		SchemaAdapter:    schema,
		OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
	}, logger)
	if err != nil {
		return 0, err
	}
	dest := &countingPublisher{}
	fwd, err := forwarder.NewForwarder(sub, dest, logger, forwarder.Config{ForwarderTopic: wmForwarderTopic, CloseTimeout: 5 * time.Second})
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- fwd.Run(rctx) }()
	deadline := time.After(b.c.WatermillMax)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
wait:
	for dest.n.Load() < int64(n) {
		select {
		case <-deadline:
			break wait
		case err := <-done:
			return 0, fmt.Errorf("forwarder stopped: %w", err)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
	el := time.Since(start)
	got := dest.n.Load()
	_ = fwd.Close()
	_ = sub.Close()
	cancel()
	<-done
	if got == 0 {
		return 0, fmt.Errorf("the forwarder forwarded nothing in %s", b.c.WatermillMax)
	}
	b.log.Info("watermill forwarder", "batch", batch, "forwarded", got, "of", n, "in", el, "per_s", int(float64(got)/el.Seconds()))
	return float64(got) / el.Seconds(), nil
}

// The relay as docs/performance.md recommends for draining a backlog:
// bigger batches (fewer round trips per event) and two workers (one
// publishes while the other's claim or mark is on the wire).
const (
	backlogBatchSize   = 500
	backlogConcurrency = 2
)

// relayDrainRate fills table with n due events and returns the rate at
// which a relay configured as above publishes and marks all of them.
func (b *bench) relayDrainRate(ctx context.Context, table string, n int) (float64, error) {
	if _, err := b.outbox(ctx, b.db, table, sqlxoutbox.Options{}); err != nil {
		return 0, err
	}
	if err := b.fill(ctx, table, n); err != nil {
		return 0, err
	}
	store, err := b.store(b.db, table, sqlxoutbox.Options{})
	if err != nil {
		return 0, err
	}
	relay, err := core.NewRelay(store, &memPublisher{}, core.RelayOptions{
		BatchSize: backlogBatchSize, Concurrency: backlogConcurrency, PollInterval: 10 * time.Millisecond, Logger: b.quiet})
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- relay.Run(rctx) }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for relay.Counters().Published < int64(n) {
		select {
		case err := <-done:
			cancel()
			return 0, fmt.Errorf("relay stopped: %w", err)
		case <-ctx.Done():
			cancel()
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
	el := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		return 0, err
	}
	return float64(n) / el.Seconds(), nil
}

// versusWatermill runs scenario b: the relay and Watermill's forwarder
// drain the same backlog of the same payloads in turn, each round; the
// row is the median of the per-round ratios, with their spread. Then both
// drain smaller backlogs once, for the curve: Watermill's forwarder slows
// as its backlog grows, the relay does not.
func (b *bench) versusWatermill(ctx context.Context) ([]row, error) {
	var ratios, relayRates, wmRates []float64
	for round := range b.c.Rounds {
		rr, err := b.relayDrainRate(ctx, "versus_events", b.c.Backlog)
		if err != nil {
			return nil, err
		}
		wr, err := b.watermill(ctx, 0, b.c.Backlog, fmt.Sprintf("r%d", round))
		if err != nil {
			return nil, err
		}
		b.log.Info("versus watermill", "round", round, "relay_per_s", int(rr), "watermill_per_s", int(wr))
		ratios, relayRates, wmRates = append(ratios, rr/wr), append(relayRates, rr), append(wmRates, wr)
	}
	b.watermillBacklogRate = median(wmRates)
	cfg := fmt.Sprintf("batch %d, %d workers", backlogBatchSize, backlogConcurrency)
	rows := []row{{
		name:  fmt.Sprintf("b  relay drain (%s) vs Watermill SQL forwarder at its defaults, equal %s backlog (events/s; median of rounds)", cfg, count(b.c.Backlog)),
		value: median(relayRates), baseline: median(wmRates), ratios: ratios,
		unit: "/s", ratioX: true, target: "≥ 20×", pass: median(ratios) >= 20, verdict: true,
	}}
	for i, n := range b.c.WatermillCurve {
		rr, err := b.relayDrainRate(ctx, "versus_events", n)
		if err != nil {
			return nil, err
		}
		wr, err := b.watermill(ctx, 0, n, fmt.Sprintf("c%d", i))
		if err != nil {
			return nil, err
		}
		rows = append(rows, row{name: fmt.Sprintf("b  the same at a %s backlog (one round)", count(n)), value: rr, baseline: wr, unit: "/s", ratioX: true, target: "—"})
	}
	small := b.c.Backlog
	if len(b.c.WatermillCurve) > 0 {
		small = b.c.WatermillCurve[0]
	}
	rr, err := b.relayDrainRate(ctx, "versus_events", small)
	if err != nil {
		return nil, err
	}
	wr1, err := b.watermill(ctx, 1, small, "batch1")
	if err != nil {
		return nil, err
	}
	rows = append(rows, row{name: fmt.Sprintf("b' the same vs Watermill with SubscribeBatchSize 1 (its safest), %s backlog", count(small)),
		value: rr, baseline: wr1, unit: "/s", ratioX: true, target: "—"})
	return rows, nil
}
