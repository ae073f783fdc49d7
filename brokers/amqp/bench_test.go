package amqpbroker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

const benchBatch = 100

// BenchmarkPublish measures events/s into one durable queue with publisher
// confirms and persistent messages, in batches of 100 as the relay sends
// them: through this package's Publisher, through amqp091-go directly (the
// same messages, all published and then all confirms awaited, and one
// confirm awaited per message), and through watermill-amqp's Publisher with
// ConfirmDelivery. Run: go test -run '^$' -bench . -benchtime 20x ./brokers/amqp
func BenchmarkPublish(b *testing.B) {
	url := testenv.AMQPURL(b)
	et := "bench." + testenv.RandomSuffix()
	consumer := "bench"
	queue := amqpbroker.QueueName(consumer, et)
	ch := rawChannel(b)
	// The queue the consumer "bench" would have, so that every variant,
	// also run alone, routes to it.
	if err := ch.ExchangeDeclare(et, amqpbroker.ExchangeFanout, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	if err := ch.QueueBind(queue, et, et, false, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ch := rawChannel(b)
		ch.QueueDelete(queue, false, false, false)
		ch.ExchangeDelete(et, false, false)
	})
	batch := func() []core.Event {
		evs := make([]core.Event, benchBatch)
		for i := range evs {
			evs[i] = event(b, et, fmt.Sprint("o-", i%10), i)
		}
		return evs
	}
	run := func(b *testing.B, publish func(ctx context.Context, evs []core.Event) error) {
		evs := batch()
		b.ResetTimer()
		start := time.Now()
		for b.Loop() {
			if err := publish(b.Context(), evs); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*benchBatch)/time.Since(start).Seconds(), "events/s")
		b.StopTimer()
		if _, err := ch.QueuePurge(queue, false); err != nil {
			b.Fatal(err)
		}
	}

	b.Run("txoutbox", func(b *testing.B) {
		p := newPublisher(b, amqpbroker.Options{Consumers: []string{consumer}})
		run(b, p.Publish)
	})

	// The raw client: the same AMQP publishings (watermill-amqp's encoding),
	// on one confirm-mode channel.
	raw := func(b *testing.B, pipelined bool) {
		conn, err := amqp.Dial(url)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		rch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if err := rch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		var m wamqp.DefaultMarshaler
		run(b, func(ctx context.Context, evs []core.Event) error {
			dcs := make([]*amqp.DeferredConfirmation, 0, len(evs))
			for i := range evs {
				msg, _ := m.Marshal(watermillbroker.NewMessage(ctx, &evs[i]))
				dc, err := rch.PublishWithDeferredConfirmWithContext(ctx, et, et, true, false, msg)
				if err != nil {
					return err
				}
				if !pipelined {
					if ok, err := dc.WaitContext(ctx); err != nil || !ok {
						return fmt.Errorf("not confirmed: %v", err)
					}
					continue
				}
				dcs = append(dcs, dc)
			}
			for _, dc := range dcs {
				if ok, err := dc.WaitContext(ctx); err != nil || !ok {
					return fmt.Errorf("not confirmed: %v", err)
				}
			}
			return nil
		})
	}
	b.Run("amqp091-pipelined", func(b *testing.B) { raw(b, true) })
	b.Run("amqp091-confirm-each", func(b *testing.B) { raw(b, false) })

	b.Run("watermill-amqp", func(b *testing.B) {
		cfg := wamqp.NewDurablePubSubConfig(url, nil)
		cfg.Publish.ConfirmDelivery = true
		cfg.Publish.ChannelPoolSize = 1
		pub, err := wamqp.NewPublisher(cfg, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		run(b, func(ctx context.Context, evs []core.Event) error {
			return watermillbroker.NewPublisher(pub, watermillbroker.Options{}).Publish(ctx, evs)
		})
	})
}
