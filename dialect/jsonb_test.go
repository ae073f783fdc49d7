package dialect_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// PostgreSQL refuses what its jsonb cannot store, naming the event and the
// rule; the databases that keep the payload as text take it.
func TestCheckEventsJSONB(t *testing.T) {
	t.Parallel()
	want := map[string]string{
		"payload with \\u0000":          `\u0000`,
		"payload with a lone surrogate": "surrogate",
		"payload number out of range":   "numeric",
	}
	for name, ev := range outboxtest.JSONBInvalidEvents() {
		if err := ev.Validate(core.Limits{}); err != nil {
			t.Errorf("%s: core.Event.Validate = %v, want nil: only PostgreSQL refuses it", name, err)
		}
		err := dialect.Postgres.CheckEvents([]core.Event{ev})
		if !errors.Is(err, core.ErrInvalidEvent) || !strings.Contains(err.Error(), want[name]) {
			t.Errorf("%s: Postgres.CheckEvents = %v, want ErrInvalidEvent naming %q", name, err, want[name])
		}
		for _, d := range []dialect.Dialect{dialect.MySQL, dialect.SQLite} {
			if err := d.CheckEvents([]core.Event{ev}); err != nil {
				t.Errorf("%s: %s.CheckEvents = %v, want nil", name, d, err)
			}
		}
	}
	for _, p := range []string{
		`null`, `{"a":[1,2.5,-3e10,"x"]}`, `"\ud83d\ude00"`, `"\\u0000"`, `"a\tb\u00e9"`,
		`1e131071`, `-0.0e-5`, `0e1000000`, `0.` + strings.Repeat("0", 16382) + `1`, `12345678901234567890e131052`,
		`{"k":"` + strings.Repeat("é", 1000) + `"}`,
	} {
		if err := dialect.Postgres.CheckEvents([]core.Event{{EventType: "t", Payload: json.RawMessage(p)}}); err != nil {
			t.Errorf("Postgres.CheckEvents(%.40q) = %v, want nil", p, err)
		}
	}
	for _, p := range []string{`1e131072`, `1e-16384`, `0e-1000000`, `0.001e131075`, `"\udc00"`, `"\ud800x"`, `"\ud800\ud800"`, `1e99999999999999999999`} {
		if err := dialect.Postgres.CheckEvents([]core.Event{{EventType: "t", Payload: json.RawMessage(p)}}); !errors.Is(err, core.ErrInvalidEvent) {
			t.Errorf("Postgres.CheckEvents(%.40q) = %v, want ErrInvalidEvent", p, err)
		}
	}
}
