package core_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// hangAfter publishes the first n events of each call and then waits for
// ctx, as a publisher on a connection that stopped answering does (for at
// most 5s, so that a relay that never cuts it off fails the test rather
// than hangs it).
func hangAfter(n int, published *atomic.Int32) core.PublisherFunc {
	return func(ctx context.Context, evs []core.Event) error {
		be := core.NewBatchError(len(evs))
		for i := range evs {
			if i < n {
				published.Add(1)
				continue
			}
			select {
			case <-ctx.Done():
				be.Errs[i] = ctx.Err()
			case <-time.After(wait.Stall):
				be.Errs[i] = errors.New("the relay never cut this publish off")
			}
		}
		return be.ErrOrNil()
	}
}

func TestPublishTimeoutFailsUnsentEvents(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	s.add(testEvents(3, "t")...)
	var published atomic.Int32
	r, err := core.NewRelay(s, hangAfter(1, &published), core.RelayOptions{
		Logger:         quiet,
		PublishTimeout: 50 * time.Millisecond,
		Retry:          core.RetryPolicy{InitialBackoff: time.Hour, Jitter: -1},
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.ProcessBatch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if res != (core.RelayCounters{Batches: 1, Claimed: 3, Published: 1, Failed: 2}) {
		t.Errorf("result %+v, want 1 published and 2 failed", res)
	}
	if ev := s.get(1); ev.PublishedAt == nil {
		t.Errorf("the event sent before the timeout was not marked published: %+v", ev)
	}
	for _, seq := range []int64{2, 3} {
		ev := s.get(seq)
		if ev.PublishedAt != nil || ev.AttemptCount != 1 || !strings.Contains(ev.LastError, core.ErrPublishTimeout.Error()) ||
			ev.NextAttemptAt.Sub(ev.CreatedAt) < 59*time.Minute {
			t.Errorf("event %d: %+v; want one failed attempt naming the timeout, retried after its backoff", seq, ev)
		}
	}
	if c := r.Counters(); c.Released != 0 {
		t.Errorf("a timed-out batch was released like a shutdown: %+v", c)
	}
}

func TestPublishTimeoutDefaultAndDisabled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		opt  time.Duration
		want time.Duration // 0: no deadline
	}{{0, 30 * time.Second}, {-1, 0}, {time.Minute, time.Minute}} {
		s := newMemStore()
		s.add(testEvents(1, "t")...)
		var left time.Duration
		var has bool
		pub := core.PublisherFunc(func(ctx context.Context, _ []core.Event) error {
			var dl time.Time
			dl, has = ctx.Deadline()
			left = time.Until(dl)
			return nil
		})
		r, err := core.NewRelay(s, pub, core.RelayOptions{Logger: quiet, PublishTimeout: tc.opt})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.ProcessBatch(context.Background()); err != nil {
			t.Fatal(err)
		}
		switch {
		case tc.want == 0 && has:
			t.Errorf("PublishTimeout %v: the publisher got a deadline %v away, want none", tc.opt, left)
		case tc.want > 0 && (!has || left > tc.want || left < tc.want-10*time.Second):
			t.Errorf("PublishTimeout %v: deadline %v away (set: %v), want about %v", tc.opt, left, has, tc.want)
		}
	}
}

// TestPublishTimeoutOrderedFailsLaterRounds: the first round of an ordered
// batch goes out, the second hangs; the timeout fails the second round's
// events (retried after backoff) instead of releasing the whole batch as a
// shutdown would, so they are not claimed again at once to hang again.
func TestPublishTimeoutOrderedFailsLaterRounds(t *testing.T) {
	t.Parallel()
	s := newOrderedMemStore()
	aggEvents(t, s, []string{"a", "b"}, 2) // a0 b0 a1 b1
	var calls, published atomic.Int32
	hang := hangAfter(0, &published)
	pub := core.PublisherFunc(func(ctx context.Context, evs []core.Event) error {
		if calls.Add(1) == 1 {
			published.Add(int32(len(evs)))
			return nil
		}
		return hang(ctx, evs)
	})
	r := orderedRelay(t, s, pub, core.RelayOptions{PublishTimeout: 50 * time.Millisecond, Retry: core.RetryPolicy{InitialBackoff: time.Hour}})
	res, err := r.ProcessBatch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if res != (core.RelayCounters{Batches: 1, Claimed: 4, Published: 2, Failed: 2}) || published.Load() != 2 {
		t.Errorf("result %+v (publisher sent %d), want round one published and round two failed", res, published.Load())
	}
	if c := r.Counters(); c.Released != 0 {
		t.Errorf("a timed-out ordered batch was released like a shutdown: %+v", c)
	}
}

// logRecorder is a slog.Handler that hands each message to a channel.
type logRecorder chan string

func (l logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l logRecorder) Handle(_ context.Context, r slog.Record) error {
	select {
	case l <- r.Message:
	default:
	}
	return nil
}
func (l logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l logRecorder) WithGroup(string) slog.Handler      { return l }

func TestPublisherIgnoringContextIsReported(t *testing.T) {
	t.Parallel()
	s := newMemStore()
	s.add(testEvents(2, "t")...)
	logs := make(logRecorder, 16)
	warned := make(chan struct{})
	go func() {
		for msg := range logs {
			if strings.Contains(msg, "ignores the context") {
				close(warned)
				return
			}
		}
	}()
	// This publisher ignores ctx: it returns only once the relay has said
	// so (or after wait.Stall, which fails the test below).
	pub := core.PublisherFunc(func(ctx context.Context, _ []core.Event) error {
		select {
		case <-warned:
		case <-time.After(wait.Stall):
		}
		return nil
	})
	r, err := core.NewRelay(s, pub, core.RelayOptions{Logger: slog.New(logs), PublishTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.ProcessBatch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-warned:
	default:
		t.Fatal("no warning about a publisher that overran its context")
	}
	// Its late success still counts: the events were sent.
	if res.Published != 2 {
		t.Errorf("result %+v, want both published", res)
	}
}

// BenchmarkPublishContext is what PublishTimeout adds to every batch (a
// context with a deadline and the overrun timer), against no timeout.
func BenchmarkPublishContext(b *testing.B) {
	for _, tc := range []struct {
		name string
		d    time.Duration
	}{{"timeout", 30 * time.Second}, {"none", -1}} {
		b.Run(tc.name, func(b *testing.B) {
			r, err := core.NewRelay(newMemStore(), &recordingPub{}, core.RelayOptions{Logger: quiet, PublishTimeout: tc.d})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			for b.Loop() {
				_, done := r.PublishContext(ctx, 100)
				done()
			}
		})
	}
}
