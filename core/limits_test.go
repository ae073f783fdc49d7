package core_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/core"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// Each invalid event names its field and wraps ErrInvalidEvent; Validate
// changes nothing.
func TestValidateRefusesAndNames(t *testing.T) {
	t.Parallel()
	want := map[string]string{
		"empty event type":         "EventType",
		"payload not JSON":         "payload",
		"ID not a UUID":            "ID",
		"payload not UTF-8":        "UTF-8",
		"payload over the limit":   "MaxPayloadBytes",
		"NUL in event type":        "EventType",
		"event type too long":      "255",
		"aggregate type not UTF-8": "AggregateType",
		"aggregate id too long":    "AggregateID",
		"NUL in aggregate id":      "AggregateID",
		"header key too long":      "header key",
		"NUL in header key":        "header key",
		"empty header key":         "header key",
		"header value not UTF-8":   "value of header",
		"NUL in header value":      "value of header",
		"too many headers":         "MaxHeaders",
		"headers too large":        "MaxHeaderBytes",
	}
	for name, ev := range outboxtest.InvalidEvents() {
		before, _ := json.Marshal(ev)
		err := ev.Validate(core.Limits{})
		if !errors.Is(err, core.ErrInvalidEvent) {
			t.Errorf("%s: Validate = %v, want ErrInvalidEvent", name, err)
			continue
		}
		if w, ok := want[name]; !ok || !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %q does not name %q", name, err, w)
		}
		if after, _ := json.Marshal(ev); string(after) != string(before) {
			t.Errorf("%s: Validate changed the event", name)
		}
	}
}

// Validate takes any valid JSON (what one database cannot store its
// dialect refuses: dialect.Dialect.CheckEvents) within the configured
// limits.
func TestValidatePayloads(t *testing.T) {
	t.Parallel()
	for _, p := range []string{`null`, `{"a":[1,2.5,-3e10,"x"]}`, `"\u0000"`, `"\ud800"`, `1e999999`} {
		ev := core.Event{EventType: "t", Payload: json.RawMessage(p)}
		if err := ev.Validate(core.Limits{}); err != nil {
			t.Errorf("Validate(%.40q) = %v, want nil", p, err)
		}
	}
	ev := core.Event{EventType: "t", Payload: json.RawMessage(`"` + strings.Repeat("x", 100) + `"`)}
	if err := ev.Validate(core.Limits{MaxPayloadBytes: 50}); !errors.Is(err, core.ErrInvalidEvent) {
		t.Errorf("a payload over a configured limit: %v", err)
	}
	if _, err := (core.Limits{MaxHeaders: -1}).WithDefaults(); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("negative limit: %v", err)
	}
}

func TestNewEventAssignsID(t *testing.T) {
	t.Parallel()
	ev, err := core.NewEvent("order", "42", "order.created", map[string]int{"n": 1})
	if err != nil || ev.ID == "" {
		t.Fatalf("NewEvent = %+v, %v; want an ID the caller can see", ev, err)
	}
	if err := ev.Prepare(); err != nil || ev.ID == "" {
		t.Fatalf("Prepare changed or refused a NewEvent: %v", err)
	}
}

// BenchmarkPrepareEvents is the client CPU Enqueue spends on an event
// before the driver: its ID, the hooks and the validation of a payload
// like the bench's order (a few strings and numbers).
func BenchmarkPrepareEvents(b *testing.B) {
	payload := []byte(`{"order_id": "o-1", "customer_id": "c-1", "currency": "EUR", "amount_cents": 12345, "status": "created", "lines": [{"sku": "SKU-1", "qty": 1}, {"sku": "SKU-2", "qty": 2}]}`)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		evs := []core.Event{{AggregateType: "order", AggregateID: "o-1", EventType: "order.created", Payload: payload}}
		if err := core.PrepareEvents(ctx, evs, core.Limits{}, nil); err != nil {
			b.Fatal(err)
		}
	}
}
