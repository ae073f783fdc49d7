package sqlxoutbox_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
)

// BenchmarkScheduledLateness measures how late scheduled events are
// published: a producer writes 1,000 events a second for 3 seconds, one
// per transaction, each scheduled 500 ms after its writing, while a relay
// with the default options (one-second poll) runs; lateness is the
// publish time minus the event's time. It reports the p50 and p99 in ms,
// per database.
//
//	go test -run '^$' -bench BenchmarkScheduledLateness -benchtime 1x ./adapters/sqlx/
func BenchmarkScheduledLateness(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			for range b.N {
				p50, p99, n := scheduledLateness(b, newEnv(b, be, sqlxoutbox.Options{}))
				b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
				b.ReportMetric(float64(n), "events")
			}
		})
	}
}

func scheduledLateness(b *testing.B, e *env) (p50, p99 time.Duration, n int) {
	const rate, seconds, ahead = 1000, 3, 500 * time.Millisecond
	var mu sync.Mutex
	var late []time.Duration
	pub := core.PublisherFunc(func(_ context.Context, evs []core.Event) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range evs {
			late = append(late, now.Sub(ev.NextAttemptAt))
		}
		return nil
	})
	relay, err := core.NewRelay(e.box, pub, core.RelayOptions{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = relay.Run(ctx) }()
	tick := time.NewTicker(time.Second / rate)
	for i := 0; i < rate*seconds; i++ {
		<-tick.C
		ev := events(1, "order.reminder", 50)[0]
		ev.NotBefore = time.Now().Add(ahead)
		e.enqueue(b, true, ev)
	}
	tick.Stop()
	deadline := time.Now().Add(ahead + 30*time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		got := len(late)
		mu.Unlock()
		if got >= rate*seconds {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(late) < rate*seconds {
		b.Fatalf("%d of %d scheduled events published", len(late), rate*seconds)
	}
	slices.Sort(late)
	if late[0] < 0 {
		b.Errorf("an event was published %v before its time", -late[0])
	}
	return late[len(late)/2], late[len(late)*99/100], len(late)
}
