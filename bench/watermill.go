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
// number of messages; each call uses a topic of its own.
func (b *bench) watermill(ctx context.Context, batch, n int) (float64, error) {
	wmForwarderTopic := fmt.Sprintf("txoutbox_bench_forwarder_%d", batch)
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
