package kafkabroker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
)

const benchBatch = 100

// BenchmarkPublish measures events/s into an in-process kfake cluster with
// acks=all and the idempotent producer, in batches of 100 over 10
// aggregates as the relay sends them: through this package's Publisher,
// plain and transactional (one transaction per batch), and through a bare
// franz-go client with the same settings and records. kfake runs in the benchmark's process and
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

	b.Run("txoutbox-transactional", func(b *testing.B) {
		run(b, newPublisher(b, cl.addrs, kafkabroker.Options{Transactional: &kafkabroker.Transactional{ID: "bench-" + fmt.Sprint(time.Now().UnixNano())}}).Publish)
	})

	// The same records through a bare franz-go client with the same
	// settings, one ProduceSync per batch.
	b.Run("kgo-ProduceSync", func(b *testing.B) {
		c, err := kgo.NewClient(kgo.SeedBrokers(cl.addrs...), kgo.AllowAutoTopicCreation(), kgo.RequiredAcks(kgo.AllISRAcks()))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		run(b, func(ctx context.Context, evs []core.Event) error {
			recs := make([]*kgo.Record, len(evs))
			for i := range evs {
				recs[i], _ = kafkabroker.Marshal(et, watermillbroker.NewMessage(ctx, &evs[i]))
			}
			return c.ProduceSync(ctx, recs...).FirstErr()
		})
	})
}
