// Package cetest checks, in the brokers' tests, that a message a broker
// delivered is the CloudEvent of an outbox event, as the CloudEvents SDK
// decodes it.
package cetest

import (
	"testing"

	"github.com/txoutbox/txoutbox/brokers/cloudevent"
	"github.com/txoutbox/txoutbox/core"
)

// Source is the source attribute the tests set.
const Source = "/txoutbox/tests"

// Check decodes a delivered message with b (cloudevent.Decode, the SDK's
// decoder) and fails t unless every attribute is ev's: id, type, source,
// subject, time, specversion, datacontenttype and data.
func Check(t testing.TB, b cloudevent.Binding, ev core.Event, headers map[string]string, body []byte, contentType string) {
	t.Helper()
	got, err := cloudevent.Decode(b, headers, body, contentType)
	if err != nil {
		t.Fatalf("event %s: %v (headers %v)", ev.ID, err, headers)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("event %s: the SDK finds the CloudEvent invalid: %v", ev.ID, err)
	}
	for _, c := range []struct{ name, got, want string }{
		{"id", got.ID(), ev.ID},
		{"type", got.Type(), ev.EventType},
		{"source", got.Source(), Source},
		{"subject", got.Subject(), ev.AggregateID},
		{"specversion", got.SpecVersion(), "1.0"},
		{"datacontenttype", got.DataContentType(), "application/json"},
		{"data", string(got.Data()), string(ev.Payload)},
	} {
		if c.got != c.want {
			t.Errorf("event %s: %s = %q, want %q", ev.ID, c.name, c.got, c.want)
		}
	}
	if ev.CreatedAt.IsZero() != got.Time().IsZero() || !got.Time().Equal(ev.CreatedAt) {
		t.Errorf("event %s: time = %v, want %v", ev.ID, got.Time(), ev.CreatedAt)
	}
	// txoutbox's own headers travel beside the attributes, so that its
	// consumers and inbox read the message as before.
	if headers[core.HeaderEventID] != ev.ID {
		t.Errorf("event %s: event_id header %q", ev.ID, headers[core.HeaderEventID])
	}
}

// Modes are the content modes to test.
var Modes = []cloudevent.Mode{cloudevent.Binary, cloudevent.Structured}
