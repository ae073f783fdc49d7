package amqpbroker_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/tier"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/testing/faultproxy"
)

// rabbitBlocked raises RabbitMQ's memory alarm (a watermark of 0 trips it
// at once), which blocks every publishing connection: the broker stays up
// and connected but reads no more publishes, so no confirm ever comes, as
// with a broker that hangs. It lifts the alarm when the test ends, even
// when it fails halfway.
func rabbitBlocked(t *testing.T) (unblock func()) {
	t.Helper()
	testenv.RabbitMQCtl(t, "set_vm_memory_high_watermark", "0")
	done := false
	unblock = func() {
		if !done {
			done = true
			testenv.RabbitMQCtl(t, "set_vm_memory_high_watermark", "0.4") // the default
		}
	}
	t.Cleanup(unblock)
	return unblock
}

// A relay whose broker stops answering gives the batch up after
// PublishTimeout: its events are recorded as failed with ErrPublishTimeout
// (so they wait out their backoff, and the claim's rows are free again)
// instead of the relay waiting for confirms that never come; once the
// broker answers again, every event arrives.
func TestOutageBlockedBrokerTimesOutPublish(t *testing.T) {
	tier.SkipShort(t) // it stops the RabbitMQ that the edit loop's other packages share
	et := "order.blocked." + testenv.RandomSuffix()
	f := newStore(t)
	pub := newPublisher(t, amqpbroker.Options{Reconnect: fastReconnect})
	got := fixtures.Receive(t, newSubscriber(t, amqpbroker.SubscriberOptions{Reconnect: fastReconnect}), et)

	evs := []core.Event{event(t, et, "a", 0), event(t, et, "b", 1), event(t, et, "c", 2)}
	if err := f.Enqueue(t.Context(), evs, true); err != nil {
		t.Fatal(err)
	}
	relay, err := core.NewRelay(f.Store, pub, core.RelayOptions{
		Logger:         quiet,
		PublishTimeout: time.Second,
		Retry:          core.RetryPolicy{InitialBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond, Jitter: -1},
	})
	if err != nil {
		t.Fatal(err)
	}

	unblock := rabbitBlocked(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := relay.ProcessBatch(ctx)
	if err != nil {
		t.Fatalf("ProcessBatch against a blocked broker: %v", err)
	}
	if res.Claimed != 3 || res.Failed != 3 {
		t.Fatalf("result %+v, want all 3 claimed and failed", res)
	}
	for _, ev := range evs {
		stored, err := f.Get(t.Context(), ev.ID)
		if err != nil {
			t.Fatal(err)
		}
		if stored.PublishedAt != nil || stored.AttemptCount != 1 || !strings.Contains(stored.LastError, core.ErrPublishTimeout.Error()) {
			t.Errorf("event %s after the timeout: published %v, attempts %d, last error %q; want unpublished, 1 attempt, the timeout named",
				ev.ID, stored.PublishedAt, stored.AttemptCount, stored.LastError)
		}
	}

	unblock()
	// The timed-out publishes may still reach the queue once the broker
	// reads them; they are duplicates, which is what at-least-once allows.
	pending := evs
	wait.For(t, "every event published after the broker was unblocked", func() (bool, any) {
		if _, err := relay.Drain(t.Context()); err != nil {
			t.Logf("drain: %v", err)
		}
		var still []core.Event
		for _, ev := range pending {
			stored, err := f.Get(t.Context(), ev.ID)
			if err != nil {
				t.Fatal(err)
			}
			if stored.PublishedAt == nil {
				still = append(still, ev)
			}
		}
		pending = still
		return len(pending) == 0, fmt.Sprintf("%d unpublished", len(pending))
	})
	got.WaitIDs(t, fixtures.EventIDs(evs))
}

// A publisher whose network to RabbitMQ starts holding every byte before
// a publish that needs a round trip amqp091 does not bound (opening a
// channel, on the first publish; declaring a topic's exchange, on a topic's
// first) still gives the publish up at its deadline, rather than when the
// heartbeat gives the connection up, and publishes again once the network
// is back. Fault-matrix cells saw relays report the broker up through a
// blackhole because of each: 12 s for the channel, 10.5 s for the declare.
func TestPublishDeadlineBoundsRoundTrips(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		openChannel bool // publish on another topic before the blackhole
	}{
		{"channel open", false},
		{"exchange declare", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u, err := url.Parse(testenv.AMQPURL(t))
			if err != nil {
				t.Fatal(err)
			}
			proxy := faultproxy.Start(t, u.Host)
			u.Host = proxy.Addr()
			// One channel, so that the publish before the blackhole opens
			// the one the held publish takes.
			pub := newPublisher(t, amqpbroker.Options{URL: u.String(), Reconnect: fastReconnect, AllowUnroutable: true, Channels: 1})
			if tc.openChannel {
				if err := pub.Publish(t.Context(), []core.Event{event(t, "order.before."+testenv.RandomSuffix(), "a", 0)}); err != nil {
					t.Fatal(err)
				}
			}
			ev := event(t, "order.held."+testenv.RandomSuffix(), "a", 0)

			if err := proxy.Blackhole(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			began := time.Now()
			err = pub.Publish(ctx, []core.Event{ev})
			took := time.Since(began)
			if !errors.Is(err, amqpbroker.ErrNotConnected) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Publish through a blackhole = %v, want ErrNotConnected and the deadline", err)
			}
			// The error carries the deadline: Publish returned on its
			// context, not on the heartbeat's end of the connection.
			t.Logf("Publish through a blackhole returned after %v (deadline 1s)", took)

			if err := proxy.Heal(); err != nil {
				t.Fatal(err)
			}
			wait.For(t, "a publish to succeed after the heal", func() (bool, any) {
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
				err := pub.Publish(ctx, []core.Event{ev})
				cancel()
				return err == nil, err
			})
		})
	}
}
