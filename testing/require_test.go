package outboxtest_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	memoutbox "github.com/txoutbox/txoutbox/adapters/memory"
	"github.com/txoutbox/txoutbox/core"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// fatalTB records the first Fatalf and stops the goroutine, as testing.T
// does, so that a helper's failure can be checked.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func fails(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(tb)
	}()
	<-done
	return tb.msg
}

func TestRequireEnqueued(t *testing.T) {
	evs := []core.Event{
		{EventType: "order.created", Payload: []byte(`{"order_id": 41}`)},
		{EventType: "order.created", Payload: []byte(`{"order_id": 42}`)},
		{EventType: "order.paid", Payload: []byte(`{"order_id": 42}`)},
	}
	if ev := outboxtest.RequireEnqueued(t, evs, "order.created", map[string]int{"order_id": 42}); string(ev.Payload) != `{"order_id": 42}` {
		t.Fatalf("found %s", ev.Payload)
	}
	if msg := fails(t, func(tb testing.TB) {
		outboxtest.RequireEnqueued(tb, evs, "order.created", map[string]int{"order_id": 7})
	}); !strings.Contains(msg, `{"order_id": 41}`) {
		t.Fatalf("a wrong payload: %q, want a failure listing the payloads of the type", msg)
	}
	if msg := fails(t, func(tb testing.TB) { outboxtest.RequireEnqueued(tb, evs, "order.shipped", nil) }); !strings.Contains(msg, "no enqueued event of type") {
		t.Fatalf("a missing type: %q", msg)
	}
}

// A relay's test asserts on what it published with a Recorder.
func TestRecorderRequirePublished(t *testing.T) {
	store := memoutbox.New(memoutbox.Options{})
	ctx := context.Background()
	tx := store.Begin()
	ev, _ := core.NewEvent("order", "42", "order.created", map[string]any{"order_id": 42})
	if err := store.Enqueue(ctx, tx, ev); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	rec := outboxtest.NewRecorder()
	relay, err := core.NewRelay(store, rec, core.RelayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rec.RequirePublished(t, "order.created", map[string]any{"order_id": 42}); got.ID != ev.ID {
		t.Fatalf("published %s, want %s", got.ID, ev.ID)
	}
	if msg := fails(t, func(tb testing.TB) { rec.RequirePublished(tb, "order.created", map[string]any{"order_id": 1}) }); msg == "" {
		t.Fatal("RequirePublished passed on a payload never published")
	}
}
