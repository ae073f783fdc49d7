package sqlxoutbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// recorder is an in-memory broker: it counts what it accepted per event ID
// and refuses the first attempt of every event whose ID is in failOnce.
type recorder struct {
	mu       sync.Mutex
	got      map[string]int
	failOnce map[string]bool
}

func (r *recorder) publish(_ context.Context, evs []core.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	be := core.NewBatchError(len(evs))
	for i, ev := range evs {
		if r.failOnce[ev.ID] {
			delete(r.failOnce, ev.ID)
			be.Errs[i] = errors.New("broker hiccup")
			continue
		}
		r.got[ev.ID]++
	}
	return be.ErrOrNil()
}

func (r *recorder) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.got {
		n += c
	}
	return n
}

// The real relay, woken by Enqueue, delivers every committed event exactly
// once (no crash here), never a rolled-back one, and retries failures; with
// DeleteOnPublish it leaves no published row behind.
func TestRelayEndToEnd(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		for _, del := range []bool{false, true} {
			name := b.name
			if del {
				name += "/delete_on_publish"
			}
			t.Run(name, func(t *testing.T) { testRelayEndToEnd(t, b, del) })
		}
	}
}

func testRelayEndToEnd(t *testing.T, b backend, deleteOnPublish bool) {
	t.Parallel()
	rec := &recorder{got: map[string]int{}, failOnce: map[string]bool{}}
	var relay *core.Relay
	e := newEnv(t, b, sqlxoutbox.Options{Notifier: core.NotifierFunc(func() { relay.Notify() }), DeleteOnPublish: deleteOnPublish})
	var err error
	relay, err = core.NewRelay(e.box, core.PublisherFunc(rec.publish), core.RelayOptions{
		BatchSize:    50,
		PollInterval: 200 * time.Millisecond,
		Concurrency:  3, // capped to 1 on SQLite
		Retry:        core.RetryPolicy{InitialBackoff: 20 * time.Millisecond, Jitter: -1},
		Logger:       quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()

	var committed, rolledBack []core.Event
	for i := range 20 {
		evs := events(25, "order.created", 5)
		if i%5 == 4 {
			rolledBack = append(rolledBack, e.enqueue(t, false, evs...)...)
			continue
		}
		// The relay may publish before enqueue returns: arm the
		// failure first.
		evs[i%len(evs)].ID = uuid.Must(uuid.NewV7()).String()
		rec.mu.Lock()
		rec.failOnce[evs[i%len(evs)].ID] = true
		rec.mu.Unlock()
		committed = append(committed, e.enqueue(t, true, evs...)...)
	}
	wait.For(t, "every committed event published", func() (bool, any) {
		n := rec.total()
		return n >= len(committed), n
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, ev := range committed {
		if rec.got[ev.ID] != 1 {
			t.Errorf("committed event %d published %d times", ev.Seq, rec.got[ev.ID])
		}
	}
	for _, ev := range rolledBack {
		if rec.got[ev.ID] != 0 {
			t.Errorf("rolled-back event %s published", ev.ID)
		}
	}
	if len(rec.failOnce) != 0 {
		t.Errorf("%d events never hit their failure", len(rec.failOnce))
	}
	s, err := e.box.Stats(context.Background())
	if err != nil || s.Pending != 0 || s.Dead != 0 {
		t.Errorf("Stats after drain = %+v, %v", s, err)
	}
	c := relay.Counters()
	if c.Published != int64(len(committed)) || c.Failed != 16 {
		t.Errorf("relay counters %+v, want %d published, 16 failed", c, len(committed))
	}
	if deleteOnPublish {
		if rows := e.rows(t); rows != 0 {
			t.Errorf("%d rows left in the outbox, want none: every event was published", rows)
		}
		return
	}
	// Every retried event records both attempts; its old error is
	// gone with its publication.
	for _, ev := range committed[:1] {
		if got := e.get(t, ev.ID); got.PublishedAt == nil || got.AttemptCount != 2 || got.LastError != "" {
			t.Errorf("retried event: %+v", got)
		}
	}
}
