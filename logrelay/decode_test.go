package logrelay

import (
	"encoding/json"
	"testing"
)

func TestDecodeEvent(t *testing.T) {
	msg := []byte(`{"id" : 7, "event_id" : "0193a0c4-0000-7000-8000-000000000001", "aggregate_type" : "order", "aggregate_id" : "o-1\nx", "event_type" : "order.created", "headers" : {"k" : "v"}, "created_at" : "2026-12-03T20:24:44.562438+00:00"}` +
		"\n" + `{"a": [1, 2], "s": "line\nbreak"}`)
	ev, err := decodeEvent(msg)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Seq != 7 || ev.AggregateID != "o-1\nx" || ev.Headers["k"] != "v" || ev.CreatedAt.IsZero() || !json.Valid(ev.Payload) {
		t.Fatalf("decoded %+v", ev)
	}
	if string(ev.Payload) != `{"a": [1, 2], "s": "line\nbreak"}` {
		t.Errorf("payload %s", ev.Payload)
	}
	for _, bad := range []string{"", "{}", "not json\n{}"} {
		if _, err := decodeEvent([]byte(bad)); err == nil && bad != "{}" {
			t.Errorf("decodeEvent(%q) = nil error", bad)
		}
	}
}

func BenchmarkDecodeEvent(b *testing.B) {
	msg := []byte(`{"id" : 7, "event_id" : "0193a0c4-0000-7000-8000-000000000001", "aggregate_type" : "order", "aggregate_id" : "o-1", "event_type" : "order.created", "headers" : {}, "created_at" : "2026-12-03T20:24:44.562438+00:00"}` +
		"\n" + `{"lines": [{"qty": 1, "sku": "SKU-1"}, {"qty": 2, "sku": "SKU-1"}], "status": "created", "currency": "EUR", "order_id": "o-1", "customer_id": "c-1", "amount_cents": 37}`)
	for b.Loop() {
		if _, err := decodeEvent(msg); err != nil {
			b.Fatal(err)
		}
	}
}
