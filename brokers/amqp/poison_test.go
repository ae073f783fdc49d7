package amqpbroker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// A channel that fails in the middle of a batch, for one event's fault,
// must not fail the others: here RabbitMQ refuses the declaration of one
// event's exchange (it exists with another type) and closes the channel
// under the events already written and those still to go. They are sent
// again on a fresh channel in the same call; only the guilty event fails.
func TestChannelFailureMidBatchSparesTheOthers(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	good := "mid.good." + testenv.RandomSuffix()
	clash := "mid.clash." + testenv.RandomSuffix()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// The publisher's fanout-per-topic topology will declare a fanout.
	if err := ch.ExchangeDeclare(clash, amqp.ExchangeDirect, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.ExchangeDelete(clash, false, false) })

	pub := newPublisher(t, amqpbroker.Options{})
	sub := newSubscriber(t, amqpbroker.SubscriberOptions{})
	col := outboxtest.Collect(t, sub, good)
	evs := make([]core.Event, 20)
	for i := range evs {
		evs[i] = event(t, good, "a", i)
	}
	evs[12] = event(t, clash, "b", 0)
	errs := core.EventErrors(pub.Publish(t.Context(), evs), len(evs))
	var want []string
	for i, err := range errs {
		if i == 12 {
			if err == nil || !strings.Contains(err.Error(), "inequivalent") && !strings.Contains(err.Error(), "PRECONDITION") {
				t.Errorf("the clashing event: %v, want the broker's refusal of its exchange", err)
			}
			continue
		}
		if err != nil {
			t.Errorf("event %d failed for another event's fault: %v", i, err)
		}
		want = append(want, evs[i].ID)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	col.Wait(ctx, want)
}

// Events RabbitMQ can never take fail alone and permanently, before
// anything is sent: a routing key or header name over 255 bytes, a body
// over MaxMessageBytes.
func TestPermanentRefusals(t *testing.T) {
	t.Parallel()
	pub := newPublisher(t, amqpbroker.Options{MaxMessageBytes: 1000, Topic: func(ev *core.Event) string { return ev.EventType }})
	topic := "perm." + testenv.RandomSuffix()
	longKey := event(t, topic, "a", 1)
	longKey.EventType = strings.Repeat("t", 300)
	longHeader := event(t, topic, "a", 2)
	longHeader.Headers = map[string]string{strings.Repeat("h", 256): "v"}
	big := event(t, topic, "a", 3)
	big.Payload = []byte(`"` + strings.Repeat("x", 1000) + `"`)
	for name, ev := range map[string]core.Event{"routing key": longKey, "header name": longHeader, "body": big} {
		err := pub.Publish(t.Context(), []core.Event{ev})
		if !core.IsPermanent(err) || !errors.Is(err, core.ErrInvalidEvent) {
			t.Errorf("%s over the limit: %v, want a permanent error wrapping ErrInvalidEvent", name, err)
		}
	}
}
