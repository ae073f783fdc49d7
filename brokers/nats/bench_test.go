package natsbroker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsbroker "github.com/txoutbox/txoutbox/brokers/nats"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

const benchBatch = 100

// BenchmarkPublish measures events/s into a JetStream stream on disk, in
// batches of 100 events of 10 aggregates as the relay sends them: through
// this package's Publisher (keeping aggregate order: each aggregate's ten
// events one round trip after the other; and with Options.Unordered), and
// through nats.go's jetstream directly with the same messages (headers
// and Nats-Msg-Id), all published and then all acknowledgements awaited,
// and one acknowledgement awaited per message. Run:
//
//	go test -run '^$' -bench . -benchtime 200x -count 5 ./brokers/nats
func BenchmarkPublish(b *testing.B) {
	s := newSpace(testenv.NATSURL(b))
	var ctl jetstream.JetStream
	nc, err := nats.Connect(s.url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	if ctl, err = jetstream.New(nc); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := ctl.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: s.stream, Subjects: []string{s.prefix + ".>"}, Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ctl.DeleteStream(context.Background(), s.stream) })
	batch := func() []core.Event {
		evs := make([]core.Event, benchBatch)
		for i := range evs {
			ev, err := core.NewEvent("order", fmt.Sprint("o-", i%10), "order.created", map[string]int{"n": i})
			if err != nil {
				b.Fatal(err)
			}
			evs[i] = ev
		}
		return evs
	}
	run := func(b *testing.B, publish func(ctx context.Context, evs []core.Event) error) {
		evs := batch()
		start := time.Now()
		for b.Loop() {
			// Fresh IDs: the duplicate window would drop a repeat.
			for i := range evs {
				evs[i].ID = uuid.NewString()
			}
			if err := publish(b.Context(), evs); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*benchBatch)/time.Since(start).Seconds(), "events/s")
	}
	subject := s.subject("order.created")

	for _, unordered := range []bool{false, true} {
		b.Run(map[bool]string{false: "txoutbox", true: "txoutbox-unordered"}[unordered], func(b *testing.B) {
			p, err := natsbroker.NewPublisher(ctx, natsbroker.Options{URL: s.url, Stream: s.stream, Unordered: unordered,
				Subject: func(*core.Event) string { return subject }})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			run(b, p.Publish)
		})
	}

	raw := func(b *testing.B, pipelined bool) {
		nc, err := nats.Connect(s.url)
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		run(b, func(ctx context.Context, evs []core.Event) error {
			futures := make([]jetstream.PubAckFuture, 0, len(evs))
			for i := range evs {
				msg := nats.NewMsg(subject)
				msg.Data = evs[i].Payload
				for k, v := range evs[i].MessageHeaders() {
					msg.Header.Set(k, v)
				}
				if !pipelined {
					if _, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(evs[i].ID), jetstream.WithExpectStream(s.stream)); err != nil {
						return err
					}
					continue
				}
				f, err := js.PublishMsgAsync(msg, jetstream.WithMsgID(evs[i].ID), jetstream.WithExpectStream(s.stream))
				if err != nil {
					return err
				}
				futures = append(futures, f)
			}
			for _, f := range futures {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					return err
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
	}
	b.Run("nats.go-pipelined", func(b *testing.B) { raw(b, true) })
	b.Run("nats.go-ack-each", func(b *testing.B) { raw(b, false) })
}
