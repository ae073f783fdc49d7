package dialect_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

func TestInsertWith(t *testing.T) {
	t.Parallel()
	q, err := dialect.Postgres.Queries("")
	if err != nil {
		t.Fatal(err)
	}
	ev := core.Event{EventType: "x", Payload: []byte(`{}`)}
	if err := ev.Prepare(); err != nil {
		t.Fatal(err)
	}
	evs := []core.Event{ev, ev}
	for _, c := range []struct{ stmt, prefix, suffix string }{
		{"INSERT INTO orders VALUES ($1, $2)", "WITH txoutbox_enqueue AS (INSERT INTO", ") INSERT INTO orders VALUES ($1, $2)"},
		{"\n  with a AS (SELECT $1) DELETE FROM orders USING a", "WITH txoutbox_enqueue AS (INSERT INTO", "), a AS (SELECT $1) DELETE FROM orders USING a"},
		{"WITH RECURSIVE n(i) AS (SELECT 1) SELECT * FROM n", "WITH RECURSIVE txoutbox_enqueue AS (INSERT INTO", "), n(i) AS (SELECT 1) SELECT * FROM n"},
	} {
		got, args, err := q.InsertWith(c.stmt, 2, evs)
		if err != nil {
			t.Errorf("%q: %v", c.stmt, err)
			continue
		}
		if !strings.HasPrefix(got, c.prefix) || !strings.HasSuffix(got, c.suffix) {
			t.Errorf("%q became %q", c.stmt, got)
		}
		// The events' 12 parameters follow the statement's 2.
		if len(args) != 12 || !strings.Contains(got, "$3 AS uuid") || !strings.Contains(got, "$14 AS jsonb") || strings.Contains(got, "$15") || strings.Contains(got, "?") {
			t.Errorf("%q: %d args, placeholders in %q", c.stmt, len(args), got)
		}
	}
	for _, stmt := range []string{"", "WITH", "  WITH  ", "TRUNCATE orders", "/* c */ INSERT INTO orders VALUES (1)", "WITHOUT x"} {
		if _, _, err := q.InsertWith(stmt, 0, evs); !errors.Is(err, dialect.ErrNotAttachable) {
			t.Errorf("%q: %v, want ErrNotAttachable", stmt, err)
		}
	}
	if _, _, err := q.InsertWith("SELECT 1", -1, evs); !errors.Is(err, dialect.ErrNotAttachable) {
		t.Errorf("negative argument count: %v", err)
	}
	if _, _, err := q.InsertWith("SELECT 1", 0, nil); err == nil {
		t.Error("no events accepted")
	}
	sq, err := dialect.SQLite.Queries("")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := sq.InsertWith("SELECT 1", 0, evs); !errors.Is(err, dialect.ErrNotAttachable) {
		t.Errorf("SQLite: %v, want ErrNotAttachable", err)
	}
}
