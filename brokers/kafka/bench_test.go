package kafkabroker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
)

const benchBatch = 100

// BenchmarkPublish measures events/s into an in-process kfake cluster with
// acks=all and the idempotent producer, in batches of 100 over 10
// aggregates as the relay sends them: through this package's Publisher,
// through a sarama SyncProducer with the same configuration and the same
// records (SendMessages per batch, and SendMessage per record), and through
// watermill-kafka's Publisher. kfake runs in the benchmark's process and
// shares its CPUs, so only the ratios mean anything.
// Run: go test -run '^$' -bench . -benchtime 50x ./brokers/kafka
func BenchmarkPublish(b *testing.B) {
	cl := newCluster(b)
	et := "bench.orders"
	batch := func() []core.Event {
		evs := make([]core.Event, benchBatch)
		for i := range evs {
			evs[i] = event(b, et, fmt.Sprint("o-", i%10), i)
		}
		return evs
	}
	run := func(b *testing.B, publish func(ctx context.Context, evs []core.Event) error) {
		evs := batch()
		if err := publish(b.Context(), evs); err != nil { // topic creation, producer ID
			b.Fatal(err)
		}
		b.ResetTimer()
		start := time.Now()
		for b.Loop() {
			if err := publish(b.Context(), evs); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*benchBatch)/time.Since(start).Seconds(), "events/s")
	}

	b.Run("txoutbox", func(b *testing.B) {
		run(b, newPublisher(b, cl.addrs, kafkabroker.Options{}).Publish)
	})

	raw := func(b *testing.B, perRecord bool) {
		cfg := kafkabroker.NewSaramaConfig() // acks=all, idempotent, 1 in flight
		prod, err := sarama.NewSyncProducer(cl.addrs, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer prod.Close()
		var m kafkabroker.Marshaler
		run(b, func(ctx context.Context, evs []core.Event) error {
			recs := make([]*sarama.ProducerMessage, len(evs))
			for i := range evs {
				recs[i], _ = m.Marshal(et, watermillbroker.NewMessage(ctx, &evs[i]))
				if perRecord {
					if _, _, err := prod.SendMessage(recs[i]); err != nil {
						return err
					}
				}
			}
			if perRecord {
				return nil
			}
			return prod.SendMessages(recs)
		})
	}
	b.Run("sarama-SendMessages", func(b *testing.B) { raw(b, false) })
	b.Run("sarama-SendMessage-each", func(b *testing.B) { raw(b, true) })

	b.Run("watermill-kafka", func(b *testing.B) {
		pub, err := wkafka.NewPublisher(wkafka.PublisherConfig{
			Brokers: cl.addrs, Marshaler: kafkabroker.Marshaler{}, OverwriteSaramaConfig: kafkabroker.NewSaramaConfig(),
		}, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		run(b, watermillbroker.NewPublisher(pub, watermillbroker.Options{}).Publish)
	})
}
