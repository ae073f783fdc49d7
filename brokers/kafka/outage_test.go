package kafkabroker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
)

// The cluster these tests stop is their own (kfake, in-process), so they
// are not named TestOutage*: make test runs those, which stop a server
// other tests share, in a serial step of their own.

// The cluster is stopped (listeners and connections closed) and started
// again on the same ports from its data directory: to the client a broker
// restart. While it is down every publish fails; after it is back the same
// publisher and consumer group carry on and every event arrives.
func TestPublisherRecoversAfterClusterDown(t *testing.T) {
	cl := newCluster(t, kfake.DataDir(t.TempDir()))
	p := newPublisher(t, cl.addrs, kafkabroker.Options{})
	et := "order.outage"
	got := fixtures.Receive(t, newSubscriber(t, cl.addrs, "outage"), et)

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

	cl.stop()
	for i := range 2 {
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second) // the relay's PublishTimeout
		err := p.Publish(ctx, during)
		cancel()
		t.Logf("attempt %d while down failed after %v", i, time.Since(t0).Round(time.Millisecond))
		var be *core.BatchError
		if !errors.As(err, &be) || be.Failed() != len(during) {
			t.Fatalf("attempt %d while down: Publish = %v, want all %d events failed", i, err, len(during))
		}
		if !errors.Is(err, kafkabroker.ErrPublish) {
			t.Errorf("attempt %d while down: %v does not wrap ErrPublish", i, err)
		}
	}
	cl.start(t)

	restarted := time.Now()
	fixtures.PublishUntilOK(t, p, during, 60*time.Second, "the cluster")
	t.Logf("publishing again %v after the restart", time.Since(restarted).Round(time.Millisecond))
	after := batch("after", 10)
	if err := p.Publish(t.Context(), after); err != nil {
		t.Fatalf("Publish after recovery: %v", err)
	}
	got.WaitIDs(t, append(fixtures.EventIDs(during), fixtures.EventIDs(after)...))
}
