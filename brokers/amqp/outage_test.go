package amqpbroker_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/tier"
)

// Tests named TestOutage* stop the shared RabbitMQ node; make test runs them
// in a serial step of their own (go test -run '^TestOutage' -p 1), and the
// normal step skips them (-skip '^TestOutage').

// fastReconnect re-dials every 100-500ms, so that tests do not wait for
// the default backoff (up to 10s).
var fastReconnect = amqpbroker.Reconnect{Min: 100 * time.Millisecond, Max: 500 * time.Millisecond}

// rabbitDown stops the RabbitMQ application (the node stays up, so the CLI
// can start it again) and makes sure it comes back when the test ends, even
// when it fails halfway.
func rabbitDown(t *testing.T) (up func()) {
	t.Helper()
	testenv.RabbitMQCtl(t, "stop_app")
	started := false
	up = func() {
		if started {
			return
		}
		started = true
		testenv.RabbitMQCtl(t, "start_app")
		testenv.RabbitMQCtl(t, "await_startup")
	}
	t.Cleanup(up)
	return up
}

// A publisher and a subscriber outlive a broker restart: while RabbitMQ is
// down every publish fails (nothing is reported as published), and after it
// is back both reconnect and every event arrives.
func TestOutagePublisherReconnects(t *testing.T) {
	tier.SkipShort(t) // it stops the RabbitMQ that the edit loop's other packages share
	et := "order.outage." + testenv.RandomSuffix()
	consumer := "outage-" + testenv.RandomSuffix()
	p := newPublisher(t, amqpbroker.Options{Consumers: []string{consumer}, Reconnect: fastReconnect})
	sub := newSubscriber(t, amqpbroker.SubscriberOptions{Consumer: consumer, Reconnect: fastReconnect})
	got := fixtures.Receive(t, sub, et)

	batch := func(name string, n int) []core.Event {
		evs := make([]core.Event, n)
		for i := range evs {
			evs[i] = event(t, et, fmt.Sprintf("%s-%d", name, i%3), i)
		}
		return evs
	}
	before, during := batch("before", 10), batch("during", 10)
	if err := p.Publish(t.Context(), before); err != nil {
		t.Fatalf("Publish before the outage: %v", err)
	}
	got.WaitIDs(t, fixtures.EventIDs(before))

	up := rabbitDown(t)
	// The connection's close notification may lag the stop by a moment;
	// every attempt must fail all the same.
	for i := range 3 {
		err := p.Publish(t.Context(), during)
		var be *core.BatchError
		if !errors.As(err, &be) || be.Failed() != len(during) {
			t.Fatalf("attempt %d while down: Publish = %v, want all %d events failed", i, err, len(during))
		}
		if !errors.Is(err, amqpbroker.ErrNotConnected) && !errors.Is(err, amqpbroker.ErrPublish) {
			t.Errorf("attempt %d while down: %v wraps neither ErrNotConnected nor ErrPublish", i, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	up()

	fixtures.PublishUntilOK(t, p, during, 60*time.Second, "the broker")
	after := batch("after", 10)
	if err := p.Publish(t.Context(), after); err != nil {
		t.Fatalf("Publish after recovery: %v", err)
	}
	got.WaitIDs(t, append(fixtures.EventIDs(during), fixtures.EventIDs(after)...))
}
