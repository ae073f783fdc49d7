package cloudevent_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/brokers/cloudevent"
	"github.com/txoutbox/txoutbox/core"
)

func testEvent(t *testing.T) core.Event {
	t.Helper()
	ev, err := core.NewEvent("order", "o-1", "order.created", map[string]int{"total_cents": 4200})
	if err != nil {
		t.Fatal(err)
	}
	ev.CreatedAt = time.Date(2026, 12, 4, 10, 30, 0, 123456000, time.UTC)
	ev.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	return ev
}

// checkAttributes fails unless got (decoded by the SDK) is ev as a
// CloudEvent of source.
func checkAttributes(t *testing.T, ev core.Event, source string, got interface {
	ID() string
	Type() string
	Source() string
	Subject() string
	Time() time.Time
	SpecVersion() string
	DataContentType() string
	Data() []byte
}) {
	t.Helper()
	for _, c := range []struct{ name, got, want string }{
		{"id", got.ID(), ev.ID},
		{"type", got.Type(), ev.EventType},
		{"source", got.Source(), source},
		{"subject", got.Subject(), ev.AggregateID},
		{"specversion", got.SpecVersion(), "1.0"},
		{"datacontenttype", got.DataContentType(), "application/json"},
		{"data", string(got.Data()), string(ev.Payload)},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	if !got.Time().Equal(ev.CreatedAt) {
		t.Errorf("time = %v, want %v", got.Time(), ev.CreatedAt)
	}
}

func TestEncodeDecodeEveryBinding(t *testing.T) {
	t.Parallel()
	ev := testEvent(t)
	for _, b := range []cloudevent.Binding{cloudevent.AMQP, cloudevent.Kafka, cloudevent.NATS, cloudevent.SNS} {
		for _, mode := range []cloudevent.Mode{cloudevent.Binary, cloudevent.Structured} {
			t.Run(b.Name+"/"+string(mode), func(t *testing.T) {
				o := cloudevent.Options{Source: "/orders", Mode: mode}
				m, err := o.Encode(&ev, b)
				if err != nil {
					t.Fatal(err)
				}
				// The event's own headers travel in both modes.
				for k, v := range ev.MessageHeaders() {
					if m.Headers[k] != v {
						t.Errorf("header %s = %q, want %q", k, m.Headers[k], v)
					}
				}
				switch mode {
				case cloudevent.Binary:
					if string(m.Body) != string(ev.Payload) || m.ContentType != "application/json" {
						t.Errorf("binary body %s (%s), want the payload as application/json", m.Body, m.ContentType)
					}
					if m.Headers[b.Prefix+"id"] != ev.ID || m.Headers[b.Prefix+"specversion"] != "1.0" {
						t.Errorf("binary headers %v: want %sid and %sspecversion", m.Headers, b.Prefix, b.Prefix)
					}
				case cloudevent.Structured:
					var doc map[string]json.RawMessage
					if err := json.Unmarshal(m.Body, &doc); err != nil || m.ContentType != cloudevent.StructuredContentType {
						t.Fatalf("structured body %s (%s): %v", m.Body, m.ContentType, err)
					}
					if string(doc["data"]) != string(ev.Payload) {
						t.Errorf("structured data %s, want the payload as JSON, not base64", doc["data"])
					}
				}
				got, err := cloudevent.Decode(b, m.Headers, m.Body, m.ContentType)
				if err != nil {
					t.Fatal(err)
				}
				checkAttributes(t, ev, "/orders", got)
			})
		}
	}
}

func TestTypeOption(t *testing.T) {
	t.Parallel()
	ev := testEvent(t)
	o := cloudevent.Options{Source: "urn:shop:orders", Type: func(ev *core.Event) string { return "com.shop." + ev.EventType }}
	m, err := o.Encode(&ev, cloudevent.Kafka)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Headers["ce_type"]; got != "com.shop.order.created" {
		t.Errorf("ce_type = %q", got)
	}
}

func TestInvalid(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]cloudevent.Options{
		"no source":  {},
		"bad mode":   {Source: "/orders", Mode: "envelope"},
		"bad source": {Source: "::not a uri"},
	} {
		if err := o.Validate(); !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("%s: Validate = %v, want core.ErrInvalidOptions", name, err)
		}
	}
	if _, err := cloudevent.Decode(cloudevent.NATS, map[string]string{"event_id": "x"}, []byte("{}"), "application/json"); !errors.Is(err, cloudevent.ErrNotCloudEvent) {
		t.Errorf("Decode of a plain message = %v, want ErrNotCloudEvent", err)
	}
}
