package amqpbroker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/brokers/cloudevent"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/cetest"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// quiet keeps watermill's logs (per-connection info, and an error with a
// stack trace for every re-dial during outages) out of test output; set
// TXOUTBOX_TEST_LOG=1 to see them.
var quiet = fixtures.Quiet()

// newPublisher connects a publisher to the test RabbitMQ and closes it when
// the test ends.
func newPublisher(t testing.TB, opts amqpbroker.Options) *amqpbroker.Publisher {
	t.Helper()
	if opts.URL == "" {
		opts.URL = testenv.AMQPURL(t)
	}
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	p, err := amqpbroker.NewPublisher(opts)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func newSubscriber(t testing.TB, opts amqpbroker.SubscriberOptions) message.Subscriber {
	t.Helper()
	if opts.URL == "" {
		opts.URL = testenv.AMQPURL(t)
	}
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	if opts.Consumer == "" {
		opts.Consumer = "test-" + testenv.RandomSuffix()
	}
	s, err := amqpbroker.NewSubscriber(opts)
	if err != nil {
		t.Fatalf("NewSubscriber: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformanceFanoutPerTopic(t *testing.T) {
	outboxtest.RunPublisher(t, func(t *testing.T) *outboxtest.BrokerFixture {
		return &outboxtest.BrokerFixture{
			Publisher:  newPublisher(t, amqpbroker.Options{}),
			Subscriber: newSubscriber(t, amqpbroker.SubscriberOptions{}),
		}
	})
}

func TestConformanceTopicExchange(t *testing.T) {
	topo := amqpbroker.Topology{Exchange: "txoutbox.test." + testenv.RandomSuffix(), ExchangeType: amqpbroker.ExchangeTopic}
	outboxtest.RunPublisher(t, func(t *testing.T) *outboxtest.BrokerFixture {
		return &outboxtest.BrokerFixture{
			Publisher:  newPublisher(t, amqpbroker.Options{Topology: topo}),
			Subscriber: newSubscriber(t, amqpbroker.SubscriberOptions{Topology: topo}),
		}
	})
}

// rawChannel opens an amqp091 channel of its own, to look at the broker's
// state behind the publisher's back.
func rawChannel(t testing.TB) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	return ch
}

func event(t testing.TB, eventType, agg string, n int) core.Event {
	t.Helper()
	ev, err := core.NewEvent("order", agg, eventType, map[string]int{"n": n})
	if err != nil {
		t.Fatal(err)
	}
	ev.ID = uuid.Must(uuid.NewV7()).String()
	ev.Headers = map[string]string{"tenant": "acme", "traceparent": fmt.Sprintf("00-%032d-%016d-01", n, n)}
	return ev
}

// get fetches one message from queue with basic.get, polling until one is
// there.
func get(t testing.TB, ch *amqp.Channel, queue string) amqp.Delivery {
	t.Helper()
	var d amqp.Delivery
	wait.Until(t, "a message in "+queue, func() bool {
		got, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		d = got
		return ok
	})
	return d
}

// The publisher declares the Consumers' durable queues, so an event
// published before any consumer subscribed waits in its queue: persistent,
// with the event's headers as AMQP string headers.
func TestDurableTopologyPersistentMessagesAndHeaders(t *testing.T) {
	t.Parallel()
	consumer := "c-" + testenv.RandomSuffix()
	et := "order.created." + testenv.RandomSuffix()
	p := newPublisher(t, amqpbroker.Options{Consumers: []string{consumer}})
	ev := event(t, et, "o-1", 1)
	if err := p.Publish(t.Context(), []core.Event{ev}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	ch := rawChannel(t)
	queue := amqpbroker.QueueName(consumer, et)
	d := get(t, ch, queue)
	if d.DeliveryMode != amqp.Persistent {
		t.Errorf("DeliveryMode = %d, want persistent (%d)", d.DeliveryMode, amqp.Persistent)
	}
	if d.Exchange != et {
		t.Errorf("exchange = %q, want %q", d.Exchange, et)
	}
	for k, want := range ev.MessageHeaders() {
		v, ok := d.Headers[k].(string)
		if !ok || v != want {
			t.Errorf("AMQP header %q = %#v, want string %q", k, d.Headers[k], want)
		}
	}
	if got := amqpbroker.Table(d.Headers)[core.HeaderEventID]; got != ev.ID {
		t.Errorf("Table()[event_id] = %q, want %q", got, ev.ID)
	}
	if string(d.Body) != string(ev.Payload) {
		t.Errorf("body = %s, want %s", d.Body, ev.Payload)
	}
	// Redeclaring as non-durable fails with PRECONDITION_FAILED (406) only
	// if the broker holds them as durable. Each failure closes the channel.
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); !isPrecondition(err) {
		t.Errorf("queue %s is not durable: redeclare as transient = %v", queue, err)
	}
	ch = rawChannel(t)
	if err := ch.ExchangeDeclare(et, amqpbroker.ExchangeFanout, false, false, false, false, nil); !isPrecondition(err) {
		t.Errorf("exchange %s is not durable: redeclare as transient = %v", et, err)
	}
	ch = rawChannel(t)
	ch.QueueDelete(queue, false, false, false)
	ch.ExchangeDelete(et, false, false)
}

func isPrecondition(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed
}

// A publish succeeds only when the broker confirmed it: a queue that
// rejects publishes when full makes RabbitMQ nack, and the nacked events are
// reported as failed, the later ones of the same aggregate not even sent.
func TestNackedPublishFails(t *testing.T) {
	t.Parallel()
	et := "order.full." + testenv.RandomSuffix()
	ch := rawChannel(t)
	queue := "full-" + testenv.RandomSuffix()
	if err := ch.ExchangeDeclare(et, amqpbroker.ExchangeFanout, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, true, false, false, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "", et, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.QueueDelete(queue, false, false, false); ch.ExchangeDelete(et, false, false) })

	p := newPublisher(t, amqpbroker.Options{})
	evs := []core.Event{event(t, et, "a", 0), event(t, et, "a", 1), event(t, et, "a", 2), event(t, et, "b", 3)}
	err := p.Publish(t.Context(), evs)
	var be *core.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("Publish = %v, want a *core.BatchError", err)
	}
	// One channel, in order: the queue takes the first, nacks the rest.
	if be.Errs[0] != nil {
		t.Errorf("first event: %v", be.Errs[0])
	}
	for i, e := range be.Errs[1:] {
		if !errors.Is(e, amqpbroker.ErrNacked) || !errors.Is(e, amqpbroker.ErrPublish) {
			t.Errorf("event %d: %v, want ErrNacked", i+1, e)
		}
	}
	if n := get(t, rawChannel(t), queue); n.Body == nil {
		t.Error("the confirmed message is not in the queue")
	}
}

// An event that no queue would receive is not confirmed as published: it
// fails with ErrUnroutable (and stays in the outbox), unless the publisher
// was told to accept that.
func TestUnroutableFails(t *testing.T) {
	t.Parallel()
	et := "order.nobody." + testenv.RandomSuffix()
	evs := []core.Event{event(t, et, "a", 0), event(t, et, "a", 1)}
	err := newPublisher(t, amqpbroker.Options{}).Publish(t.Context(), evs)
	var be *core.BatchError
	if !errors.As(err, &be) || be.Failed() != 2 || !errors.Is(be.Errs[0], amqpbroker.ErrUnroutable) || !errors.Is(be.Errs[1], amqpbroker.ErrUnroutable) {
		t.Fatalf("Publish to an exchange without queues = %v, want 2 ErrUnroutable", err)
	}
	if err := newPublisher(t, amqpbroker.Options{AllowUnroutable: true}).Publish(t.Context(), evs); err != nil {
		t.Fatalf("AllowUnroutable: Publish = %v", err)
	}
	rawChannel(t).ExchangeDelete(et, false, false)
}

// With a direct exchange, the routing key is the event type and a
// subscriber receives only its own topic.
func TestDirectExchangeRoutesByEventType(t *testing.T) {
	t.Parallel()
	topo := amqpbroker.Topology{Exchange: "txoutbox.direct." + testenv.RandomSuffix(), ExchangeType: amqpbroker.ExchangeDirect}
	p := newPublisher(t, amqpbroker.Options{Topology: topo})
	sub := newSubscriber(t, amqpbroker.SubscriberOptions{Topology: topo})
	created, paid := "order.created", "order.paid"
	gotCreated := fixtures.Receive(t, sub, created)
	gotPaid := fixtures.Receive(t, sub, paid)
	evs := []core.Event{event(t, created, "o-1", 0), event(t, paid, "o-1", 1), event(t, created, "o-2", 2)}
	if err := p.Publish(t.Context(), evs); err != nil {
		t.Fatal(err)
	}
	c := gotCreated.Wait(t, 2)
	pd := gotPaid.Wait(t, 1)
	// o-1 and o-2 are different aggregates, published in parallel.
	if got := gotCreated.IDs(); len(c) != 2 || got[evs[0].ID] != 1 || got[evs[2].ID] != 1 {
		t.Errorf("order.created got %v", got)
	}
	if pd[0].Metadata.Get(core.HeaderEventID) != evs[1].ID {
		t.Errorf("order.paid got %v", pd)
	}
	time.Sleep(200 * time.Millisecond)
	if n := gotCreated.Count() + gotPaid.Count(); n != 3 {
		t.Errorf("received %d messages, want 3", n)
	}
	ch := rawChannel(t)
	ch.ExchangeDelete(topo.Exchange, false, false)
}

// Consumers with the same name share a queue (a consumer group): each
// event goes to one of them; a different name gets its own copy.
func TestConsumerGroups(t *testing.T) {
	t.Parallel()
	et := "order.grouped." + testenv.RandomSuffix()
	group := "g-" + testenv.RandomSuffix()
	p := newPublisher(t, amqpbroker.Options{})
	a := fixtures.Receive(t, newSubscriber(t, amqpbroker.SubscriberOptions{Consumer: group, Prefetch: 1}), et)
	b := fixtures.Receive(t, newSubscriber(t, amqpbroker.SubscriberOptions{Consumer: group, Prefetch: 1}), et)
	other := fixtures.Receive(t, newSubscriber(t, amqpbroker.SubscriberOptions{}), et)
	var evs []core.Event
	for i := range 20 {
		evs = append(evs, event(t, et, fmt.Sprint("o-", i), i))
	}
	if err := p.Publish(t.Context(), evs); err != nil {
		t.Fatal(err)
	}
	other.Wait(t, 20)
	wait.For(t, "20 messages to the group", func() (bool, any) {
		n := a.Count() + b.Count()
		return n >= 20, n
	})
	if a.Count()+b.Count() != 20 {
		t.Fatalf("group received %d+%d, want 20 in all", a.Count(), b.Count())
	}
	time.Sleep(200 * time.Millisecond)
	if a.Count()+b.Count() != 20 || other.Count() != 20 {
		t.Errorf("group %d+%d, other %d; want 20 and 20", a.Count(), b.Count(), other.Count())
	}
}

func TestInvalidOptions(t *testing.T) {
	for name, opts := range map[string]amqpbroker.Options{
		"no URL":            {},
		"type, no exchange": {URL: "amqp://x", Topology: amqpbroker.Topology{ExchangeType: "topic"}},
		"headers exchange":  {URL: "amqp://x", Topology: amqpbroker.Topology{Exchange: "x", ExchangeType: "headers"}},
		"negative channels": {URL: "amqp://x", Channels: -1},
	} {
		if _, err := amqpbroker.NewPublisher(opts); !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("%s: NewPublisher = %v, want core.ErrInvalidOptions", name, err)
		}
	}
	if _, err := amqpbroker.NewSubscriber(amqpbroker.SubscriberOptions{URL: "amqp://x"}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("NewSubscriber without Consumer = %v, want core.ErrInvalidOptions", err)
	}
}

func TestPublishEmptyTopicIsInvalid(t *testing.T) {
	t.Parallel()
	p := newPublisher(t, amqpbroker.Options{Topic: func(*core.Event) string { return "" }})
	err := p.Publish(t.Context(), []core.Event{event(t, "x", "a", 0)})
	if !errors.Is(err, core.ErrInvalidEvent) {
		t.Fatalf("Publish = %v, want ErrInvalidEvent", err)
	}
}

// A nacked message is requeued and delivered again; an acked one is gone.
func TestSubscriberNackRedelivers(t *testing.T) {
	t.Parallel()
	et := "order.nack." + testenv.RandomSuffix()
	sub := newSubscriber(t, amqpbroker.SubscriberOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, et)
	if err != nil {
		t.Fatal(err)
	}
	ev := event(t, et, "o-1", 0)
	if err := newPublisher(t, amqpbroker.Options{}).Publish(ctx, []core.Event{ev}); err != nil {
		t.Fatal(err)
	}
	first := <-msgs
	if first == nil || first.UUID != ev.ID {
		t.Fatalf("first delivery %v, want UUID %s", first, ev.ID)
	}
	first.Nack()
	again := <-msgs
	if again == nil || again.UUID != ev.ID {
		t.Fatalf("after Nack got %v, want %s again", again, ev.ID)
	}
	again.Ack()
	select {
	case m := <-msgs:
		t.Fatalf("acked message delivered again: %v", m.UUID)
	case <-time.After(500 * time.Millisecond):
	}
	rawChannel(t).ExchangeDelete(et, false, false)
}

// Publish gives up on a cancelled context without reporting success.
func TestPublishCancelledContext(t *testing.T) {
	t.Parallel()
	et := "order.cancel." + testenv.RandomSuffix()
	p := newPublisher(t, amqpbroker.Options{Consumers: []string{"c"}, Channels: 1})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := p.Publish(ctx, []core.Event{event(t, et, "o-1", 0)}); err == nil {
		t.Fatal("Publish with a cancelled context = nil")
	}
	// The publisher is still usable.
	if err := p.Publish(t.Context(), []core.Event{event(t, et, "o-1", 1)}); err != nil {
		t.Fatalf("Publish after a cancelled one: %v", err)
	}
	ch := rawChannel(t)
	ch.QueueDelete(amqpbroker.QueueName("c", et), false, false, false)
	ch.ExchangeDelete(et, false, false)
}

// With CloudEvents on, the message in the queue is the event as a
// CloudEvent (AMQP binding: "cloudEvents:" application properties, the
// content-type property), in both content modes, as the SDK decodes it
// from the raw AMQP message.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for _, mode := range cetest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			consumer := "ce-" + testenv.RandomSuffix()
			et := "order.created." + testenv.RandomSuffix()
			p := newPublisher(t, amqpbroker.Options{Consumers: []string{consumer}, CloudEvents: &cloudevent.Options{Source: cetest.Source, Mode: mode}})
			ev := event(t, et, "o-1", 1)
			ev.CreatedAt = time.Now().UTC().Truncate(time.Microsecond)
			if err := p.Publish(t.Context(), []core.Event{ev}); err != nil {
				t.Fatal(err)
			}
			d := get(t, rawChannel(t), amqpbroker.QueueName(consumer, et))
			h := map[string]string{}
			for k, v := range d.Headers {
				if s, ok := v.(string); ok {
					h[k] = s
				}
			}
			cetest.Check(t, cloudevent.AMQP, ev, h, d.Body, d.ContentType)
		})
	}
	if _, err := amqpbroker.NewPublisher(amqpbroker.Options{URL: "amqp://127.0.0.1:1/", CloudEvents: &cloudevent.Options{}}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("CloudEvents without a Source: %v, want core.ErrInvalidOptions before connecting", err)
	}
}
