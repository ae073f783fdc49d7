package main

import (
	"context"
	"database/sql"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/brokers/cloudevent"
	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	natsbroker "github.com/txoutbox/txoutbox/brokers/nats"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/cetest"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/tracing"
)

var quiet = slog.New(slog.DiscardHandler)

// receive reads n messages of topic from sub, acking each, and returns them
// by event ID.
func receive(t *testing.T, sub message.Subscriber, topic string, n int) (map[string]*message.Message, func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		cancel()
		t.Fatalf("subscribe %s: %v", topic, err)
	}
	got := map[string]*message.Message{}
	wait := func() {
		defer cancel()
		for len(got) < n {
			select {
			case msg, ok := <-ch:
				if !ok {
					t.Fatalf("subscription closed after %d of %d messages", len(got), n)
				}
				got[msg.Metadata.Get(core.HeaderEventID)] = msg
				msg.Ack()
			case <-ctx.Done():
				t.Fatalf("received %d of %d messages on %s", len(got), n, topic)
			}
		}
	}
	return got, wait
}

// TestRelayToRabbitMQ runs the relay against the real RabbitMQ, and follows
// a trace from the producer, through the relay's headers, to the consumer.
func TestRelayToRabbitMQ(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	amqpURL := testenv.AMQPURL(t)
	eventType := "cli.rabbit." + testenv.RandomSuffix()
	consumer := "cli-" + testenv.RandomSuffix()

	// The producer traces and writes the trace context into the headers.
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	tr := tracing.New(tracing.Options{TracerProvider: tp})
	traced, err := sqlxoutbox.NewDB(f.db, sqlxoutbox.Options{Hooks: []core.EnqueueHook{tr.EnqueueHook()}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, span := tp.Tracer("app").Start(context.Background(), "POST /orders")
	evs := make([]core.Event, 5)
	for i := range evs {
		evs[i] = core.Event{EventType: eventType, AggregateType: "order", AggregateID: "1", Payload: []byte(`{"ok":true}`)}
	}
	enqueueWith(t, ctx, f.db, traced, evs)
	span.End()

	sub, err := amqpbroker.NewSubscriber(amqpbroker.SubscriberOptions{URL: amqpURL, Consumer: consumer, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got, wait := receive(t, sub, eventType, len(evs))

	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("consumers", consumer)
	u.RawQuery = q.Encode()
	r := ok(t, f.dsn, "relay", "--broker", u.String(), "--drain", "--http-addr", "")
	if strings.Contains(r.stderr, "guest:guest") {
		t.Fatalf("the broker password reached the log:\n%s", r.stderr)
	}
	wait()
	if n := f.count(t, "published_at IS NULL"); n != 0 {
		t.Fatalf("%d events unpublished", n)
	}
	for _, ev := range evs {
		msg := got[ev.ID]
		if msg == nil {
			t.Fatalf("event %s not received", ev.ID)
		}
		_, cs := tr.StartConsumer(context.Background(), consumer, msg.Metadata)
		if cs.SpanContext().TraceID() != span.SpanContext().TraceID() {
			t.Fatalf("consumer span in trace %s, want the producer's %s", cs.SpanContext().TraceID(), span.SpanContext().TraceID())
		}
		cs.End()
	}
}

func enqueueWith(t *testing.T, ctx context.Context, db *sql.DB, ob *sqlxoutbox.Outbox, evs []core.Event) {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Enqueue(ctx, tx, evs...); err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestRelayToKafka runs the relay against an in-process Kafka (kfake, a real
// Kafka protocol server) and reads the events back with a consumer group.
func TestRelayToKafka(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(2),
		kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	eventType := "cli.kafka." + testenv.RandomSuffix()
	evs := f.enqueue(t, eventType, "7", 6)
	r := ok(t, f.dsn, "relay", "--broker", "kafka://"+strings.Join(c.ListenAddrs(), ","), "--drain", "--http-addr", "")
	if n := f.count(t, "published_at IS NULL"); n != 0 {
		t.Fatalf("%d events unpublished:\n%s", n, r.stderr)
	}
	// Kafka keeps per-key order, and the default migration has what
	// ordered mode needs: ordered with no flag and no extra step.
	if !strings.Contains(r.stderr, "ordered=true") || strings.Contains(r.stderr, "unordered") {
		t.Fatalf("the relay to Kafka did not run ordered by default:\n%s", r.stderr)
	}
	sub, err := kafkabroker.NewSubscriber(kafkabroker.SubscriberOptions{Brokers: c.ListenAddrs(), ConsumerGroup: "cli-test", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got, wait := receive(t, sub, eventType, len(evs))
	wait()
	for _, ev := range evs {
		msg := got[ev.ID]
		if msg == nil || msg.Metadata.Get(core.HeaderAggregateID) != "7" {
			t.Fatalf("event %s: %v", ev.ID, msg)
		}
	}
}

// TestRelayToSNS runs the relay against the SNS emulator: the topic is
// created and every event is accepted before it is marked published.
func TestRelayToSNS(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	endpoint := testenv.SNSEndpoint(t)
	evs := f.enqueue(t, "cli_sns_"+testenv.RandomSuffix(), "1", 3)
	broker := "sns://?region=us-east-1&create_topics=true&max_batch_size=1&endpoint=" + url.QueryEscape(endpoint)
	r := run(t, "", []string{"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"},
		"relay", "--dsn", f.dsn, "--broker", broker, "--drain", "--http-addr", "", "--max-attempts", "1")
	if r.code != 0 {
		t.Fatalf("relay to SNS: exit %d\n%s", r.code, r.stderr)
	}
	if n := f.count(t, "published_at IS NOT NULL"); n != len(evs) {
		t.Fatalf("%d of %d events published to SNS:\n%s", n, len(evs), r.stderr)
	}
	// A broker URL without a way to find topics is a usage error.
	r = run(t, "", nil, "relay", "--dsn", f.dsn, "--broker", "sns://?region=us-east-1", "--drain", "--http-addr", "")
	if r.code != exitUsage || !strings.Contains(r.stderr, "create_topics") {
		t.Fatalf("sns:// without topics: exit %d\n%s", r.code, r.stderr)
	}
}

// TestRelayToNATS runs the relay against the real nats-server: the stream
// is created from ?subjects=, every event is acknowledged by JetStream
// before it is marked published, and a consumer reads them back.
func TestRelayToNATS(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sfx := testenv.RandomSuffix()
	eventType := "cli.nats." + sfx
	evs := f.enqueue(t, eventType, "7", 6)
	natsURL := testenv.NATSURL(t)
	stream := "CLI" + sfx
	r := ok(t, f.dsn, "relay", "--broker", natsURL+"?stream="+stream+"&subjects=cli.nats."+sfx+"&duplicate_window=1m", "--drain", "--http-addr", "")
	if n := f.count(t, "published_at IS NULL"); n != 0 {
		t.Fatalf("%d events unpublished:\n%s", n, r.stderr)
	}
	// JetStream keeps one aggregate's order, so the relay runs ordered.
	if !strings.Contains(r.stderr, "ordered=true") {
		t.Fatalf("the relay to NATS did not run ordered by default:\n%s", r.stderr)
	}
	sub, err := natsbroker.NewSubscriber(natsbroker.SubscriberOptions{URL: natsURL, Stream: stream, Consumer: "cli-test", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got, wait := receive(t, sub, eventType, len(evs))
	wait()
	for _, ev := range evs {
		if msg := got[ev.ID]; msg == nil || msg.Metadata.Get(core.HeaderAggregateID) != "7" {
			t.Fatalf("event %s: %v", ev.ID, msg)
		}
	}
	// Without ?stream= it is a usage error, before anything connects.
	r = run(t, "", nil, "relay", "--dsn", f.dsn, "--broker", natsURL, "--drain", "--http-addr", "")
	if r.code != exitUsage || !strings.Contains(r.stderr, "stream=") {
		t.Fatalf("nats:// without a stream: exit %d\n%s", r.code, r.stderr)
	}
}

// TestRelayCloudEvents relays with ?cloudevents=structured: the stream
// holds each event as a CloudEvent the SDK decodes. A CloudEvents mode
// without a source is a usage error.
func TestRelayCloudEvents(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sfx := testenv.RandomSuffix()
	eventType := "cli.ce." + sfx
	evs := f.enqueue(t, eventType, "7", 2)
	natsURL := testenv.NATSURL(t)
	stream := "CE" + sfx
	ok(t, f.dsn, "relay", "--broker", natsURL+"?stream="+stream+"&subjects="+eventType+"&cloudevents=structured&cloudevents_source="+url.QueryEscape(cetest.Source), "--drain", "--http-addr", "")
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	for i := range evs {
		raw, err := st.GetMsg(t.Context(), uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		h := map[string]string{}
		for k, v := range raw.Header {
			h[k] = v[0]
		}
		var ev core.Event
		for _, e := range evs {
			if e.ID == h[core.HeaderEventID] {
				ev = e
			}
		}
		got, err := cloudevent.Decode(cloudevent.NATS, h, raw.Data, "")
		if err != nil || got.ID() != ev.ID || got.Source() != cetest.Source || got.Type() != eventType || got.Subject() != "7" || string(got.Data()) != string(ev.Payload) {
			t.Fatalf("message %d: %v (%v), want event %s as a CloudEvent", i, got, err, ev.ID)
		}
	}
	r := run(t, "", nil, "relay", "--dsn", f.dsn, "--broker", natsURL+"?stream="+stream+"&cloudevents=binary", "--drain", "--http-addr", "")
	if r.code != exitUsage || !strings.Contains(r.stderr, "Source") {
		t.Fatalf("cloudevents without a source: exit %d\n%s", r.code, r.stderr)
	}
}
