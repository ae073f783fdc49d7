package archive_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/archive"
	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// recorder is a Publisher that records what it is given (a unit test's
// broker), failing the events the fail function picks.
type recorder struct {
	mu   sync.Mutex
	got  []core.Event
	fail func(core.Event) error
}

func (r *recorder) Publish(_ context.Context, evs []core.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	be := core.NewBatchError(len(evs))
	for i, ev := range evs {
		if r.fail != nil {
			if err := r.fail(ev); err != nil {
				be.Errs[i] = err
				continue
			}
		}
		r.got = append(r.got, ev)
	}
	return be.ErrOrNil()
}

func (*recorder) Capabilities() core.PublisherCapabilities { return core.PublisherCapabilities{} }

// TestReplayFilters: the table replay's filters select the same events
// from the archive, in Seq order, and the progress counts to the total.
func TestReplayFilters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := openOutbox(t, "sqlite")
	ids := o.produce(t, 300)
	o.publishAll(t)
	b, _ := openBucket(t)
	a, err := archive.New(o.ob, b, archive.Options{BatchSize: 70})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.ArchiveBefore(ctx, time.Now().Add(time.Minute), nil); err != nil {
		t.Fatal(err)
	}
	all := archived(t, b, "")
	seqOf := func(i int) int64 { return all[i].Seq }
	for _, tc := range []struct {
		name string
		f    archive.Filter
		want func(i int, ev core.Event) bool
	}{
		{"all", archive.Filter{All: true}, func(int, core.Event) bool { return true }},
		{"seq range across objects", archive.Filter{FromSeq: seqOf(50), ToSeq: seqOf(160)},
			func(i int, _ core.Event) bool { return i >= 50 && i <= 160 }},
		{"type", archive.Filter{EventType: "order.paid"}, func(i int, _ core.Event) bool { return i%2 == 1 }},
		{"aggregate", archive.Filter{AggregateType: "order", AggregateID: "2"}, func(i int, _ core.Event) bool { return i%3 == 2 }},
		{"type and seq", archive.Filter{EventType: "order.created", FromSeq: seqOf(100)},
			func(i int, _ core.Event) bool { return i%2 == 0 && i >= 100 }},
		{"created range", archive.Filter{CreatedFrom: all[0].CreatedAt.Add(-time.Second), CreatedTo: all[0].CreatedAt.Add(-time.Millisecond)},
			func(int, core.Event) bool { return false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want []string
			for i, ev := range all {
				if tc.want(i, ev) {
					want = append(want, ids[i])
				}
			}
			pub := &recorder{}
			var last, total int64
			n, err := archive.Replay(ctx, archive.NewReader(b, ""), pub, tc.f, archive.ReplayOptions{
				BatchSize: 32, OnProgress: func(done, tot int64) { last, total = done, tot },
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := idsOf(pub.got); !slices.Equal(got, want) || n != int64(len(want)) {
				t.Fatalf("replayed %d events (%d), want %d", len(got), n, len(want))
			}
			if len(want) > 0 && (last != int64(len(want)) || total != int64(len(want))) {
				t.Fatalf("progress ended at %d of %d, want %d of %d", last, total, len(want), len(want))
			}
		})
	}
	if _, err := archive.Replay(ctx, archive.NewReader(b, ""), &recorder{}, archive.Filter{}, archive.ReplayOptions{}); !errors.Is(err, dialect.ErrInvalidFilter) {
		t.Fatalf("empty filter: %v, want ErrInvalidFilter", err)
	}
}

// TestReplayRetriesAndStops: failed events are tried again; an event that
// keeps failing stops the replay with an error naming it, after the
// events before it were published.
func TestReplayRetriesAndStops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := openOutbox(t, "sqlite")
	o.produce(t, 40)
	o.publishAll(t)
	b, _ := openBucket(t)
	a, _ := archive.New(o.ob, b, archive.Options{})
	if _, err := a.ArchiveBefore(ctx, time.Now().Add(time.Minute), nil); err != nil {
		t.Fatal(err)
	}
	all := archived(t, b, "")
	flaky := map[int64]int{all[5].Seq: 2}
	pub := &recorder{fail: func(ev core.Event) error {
		if flaky[ev.Seq] > 0 {
			flaky[ev.Seq]--
			return errors.New("broker hiccup")
		}
		return nil
	}}
	quiet := slog.New(slog.DiscardHandler)
	n, err := archive.Replay(ctx, archive.NewReader(b, ""), pub, archive.Filter{All: true},
		archive.ReplayOptions{BatchSize: 10, Backoff: time.Millisecond, Logger: quiet})
	if err != nil || n != 40 || len(pub.got) != 40 {
		t.Fatalf("flaky broker: %d replayed, %d received, %v", n, len(pub.got), err)
	}
	stuck := all[25].Seq
	pub = &recorder{fail: func(ev core.Event) error {
		if ev.Seq == stuck {
			return errors.New("broker down")
		}
		return nil
	}}
	n, err = archive.Replay(ctx, archive.NewReader(b, ""), pub, archive.Filter{All: true},
		archive.ReplayOptions{BatchSize: 10, Attempts: 3, Backoff: time.Millisecond, Logger: quiet})
	if err == nil || n != 20 || !strings.Contains(err.Error(), fmt.Sprintf("seq %d", stuck)) {
		t.Fatalf("stuck event: %d replayed, %v; want 20 and an error naming seq %d", n, err, stuck)
	}
	pub = &recorder{fail: func(ev core.Event) error {
		if ev.Seq == stuck {
			return core.Permanent(errors.New("too large"))
		}
		return nil
	}}
	if _, err = archive.Replay(ctx, archive.NewReader(b, ""), pub, archive.Filter{All: true},
		archive.ReplayOptions{BatchSize: 10, Logger: quiet}); err == nil || !core.IsPermanent(err) {
		t.Fatalf("permanent failure: %v, want it returned at once", err)
	}
}

// TestReplayThroughRabbitMQ: archived events published again through a
// real broker arrive with their original event IDs, types and payloads.
func TestReplayThroughRabbitMQ(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := openOutbox(t, "postgres")
	o.produce(t, 120)
	o.publishAll(t)
	b, _ := openBucket(t)
	a, _ := archive.New(o.ob, b, archive.Options{BatchSize: 50})
	if _, err := a.ArchiveBefore(ctx, time.Now().Add(time.Minute), nil); err != nil {
		t.Fatal(err)
	}
	all := archived(t, b, "")
	quiet := slog.New(slog.DiscardHandler)
	pub, err := amqpbroker.NewPublisher(amqpbroker.Options{URL: testenv.AMQPURL(t), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sub, err := amqpbroker.NewSubscriber(amqpbroker.SubscriberOptions{URL: testenv.AMQPURL(t), Logger: quiet, Consumer: "archive-" + testenv.RandomSuffix()})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	col := outboxtest.Collect(t, sub, "order.paid")
	var want []core.Event
	for _, ev := range all {
		if ev.EventType == "order.paid" {
			want = append(want, ev)
		}
	}
	n, err := archive.Replay(ctx, archive.NewReader(b, ""), pub, archive.Filter{EventType: "order.paid"}, archive.ReplayOptions{})
	if err != nil || n != int64(len(want)) {
		t.Fatalf("replayed %d, %v; want %d", n, err, len(want))
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got := col.Wait(wctx, idsOf(want))
	if err := outboxtest.CheckMessages(want, got); err != nil {
		t.Fatal(err)
	}
}
