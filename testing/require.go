package outboxtest

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/core"
)

// RequireEnqueued fails t unless events hold one of eventType whose payload
// is want as JSON (want is marshalled; nil accepts any payload), and
// returns the last such event. events are what a producer's transaction
// wrote: sqlxoutbox.Outbox.PendingTx in the transaction, or
// gormoutbox.PendingEvents before the commit.
//
//	evs, err := outbox.PendingTx(ctx, tx, "order.created")
//	if err != nil { t.Fatal(err) }
//	ev := outboxtest.RequireEnqueued(t, evs, "order.created", map[string]any{"order_id": 42})
func RequireEnqueued(t testing.TB, events []core.Event, eventType string, want any) core.Event {
	t.Helper()
	return requireEvent(t, "enqueued", events, eventType, want)
}

// RequirePublished fails t unless rec was given an event of eventType whose
// payload is want as JSON (nil: any), and returns the last such event: for
// tests that run a relay on a Recorder.
func (r *Recorder) RequirePublished(t testing.TB, eventType string, want any) core.Event {
	t.Helper()
	return requireEvent(t, "published", r.Events(), eventType, want)
}

func requireEvent(t testing.TB, what string, events []core.Event, eventType string, want any) core.Event {
	t.Helper()
	var wantJSON []byte
	if want != nil {
		var err error
		if wantJSON, err = json.Marshal(want); err != nil {
			t.Fatalf("outboxtest: marshal the wanted payload: %v", err)
		}
	}
	var seen []string
	for i := len(events) - 1; i >= 0; i-- {
		ev := events[i]
		if ev.EventType != eventType {
			continue
		}
		if want == nil || jsonEqual(ev.Payload, wantJSON) {
			return ev
		}
		seen = append(seen, string(ev.Payload))
	}
	if len(seen) == 0 {
		types := map[string]int{}
		for _, ev := range events {
			types[ev.EventType]++
		}
		t.Fatalf("no %s event of type %q among %d events (types: %v)", what, eventType, len(events), types)
	}
	t.Fatalf("no %s %q event with payload %s; those of the type have:\n  %s", what, eventType, wantJSON, strings.Join(seen, "\n  "))
	return core.Event{}
}
