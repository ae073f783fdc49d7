package kafkabroker_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
)

// A broker that reads produce requests and never answers them: Publish
// returns when its context ends (the relay's PublishTimeout), naming every
// event as failed with the context's error, instead of waiting out the client's
// network timeouts and retries; once the broker answers again, the same
// publisher delivers the events.
func TestPublishReturnsWhenContextEnds(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	var hang atomic.Bool
	hang.Store(true)
	cl.c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		cl.c.KeepControl()
		// Handled with neither a response nor an error: kfake reads on
		// and the request is never answered.
		return nil, nil, hang.Load()
	})
	// The client gives up on the unanswered request after these and
	// retries, which is what lets the events through once the broker
	// answers.
	p := newPublisher(t, cl.addrs, kafkabroker.Options{Client: []kgo.Opt{
		kgo.ProduceRequestTimeout(time.Second), kgo.RequestTimeoutOverhead(time.Second),
	}})
	var evs []core.Event
	for i := range 5 {
		evs = append(evs, event(t, "order.hung", fmt.Sprint("o-", i%2), i))
	}

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err := p.Publish(ctx, evs)
	var be *core.BatchError
	if !errors.As(err, &be) || be.Failed() != len(evs) {
		t.Fatalf("Publish to a broker that never answers = %v, want every event failed", err)
	}
	for i, e := range be.Errs {
		if !errors.Is(e, context.DeadlineExceeded) || !errors.Is(e, kafkabroker.ErrPublish) {
			t.Errorf("event %d: %v; want ErrPublish wrapping the context's deadline", i, e)
		}
	}

	hang.Store(false)
	fixtures.PublishUntilOK(t, p, evs, 60*time.Second, "once the broker answers again")
}

// Publish after Close fails with ErrClosed instead of panicking on the
// closed producer.
func TestPublishAfterClose(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	p := newPublisher(t, cl.addrs, kafkabroker.Options{})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(t.Context(), []core.Event{event(t, "order.closed", "o", 0)}); !errors.Is(err, core.ErrClosed) {
		t.Fatalf("Publish after Close = %v, want ErrClosed", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
