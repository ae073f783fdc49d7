package sqlxoutbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// execWith runs ExecWithEvents in a transaction of its own and commits it
// when the statement succeeded and commit is set.
func (e *env) execWith(t *testing.T, commit bool, query string, args []any, evs ...core.Event) (int64, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	res, err := e.box.ExecWithEvents(ctx, tx, query, args, evs...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		t.Fatal(err)
	}
	if commit {
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	return n, nil
}

func (e *env) count(t *testing.T, query string) int {
	t.Helper()
	var n int
	if err := e.db.GetContext(context.Background(), &n, query); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestExecWithEvents(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			var notified atomic.Int64
			hook := func(_ context.Context, ev *core.Event) error {
				ev.Headers = map[string]string{"hooked": ev.ID}
				return nil
			}
			e := newEnv(t, b, sqlxoutbox.Options{
				Notifier: core.NotifierFunc(func() { notified.Add(1) }),
				Hooks:    []core.EnqueueHook{hook},
			})
			insert := e.db.Rebind("INSERT INTO orders (id, total) VALUES (?, ?)")

			// Committed: the order and both events; the statement's own
			// result is unchanged.
			evs := events(2, "order.created", 1)
			n, err := e.execWith(t, true, insert, []any{"o-1", 42}, evs...)
			if err != nil {
				t.Fatalf("ExecWithEvents: %v", err)
			}
			if n != 1 {
				t.Errorf("rows affected %d, want the statement's 1", n)
			}
			if evs[0].ID == "" || evs[1].ID == "" || evs[0].ID == evs[1].ID {
				t.Errorf("IDs not written back: %q %q", evs[0].ID, evs[1].ID)
			}
			for _, ev := range evs {
				got := e.get(t, ev.ID)
				if got.EventType != "order.created" || got.Headers["hooked"] != ev.ID || !strings.Contains(string(got.Payload), `"n"`) {
					t.Errorf("stored %+v, want %+v with the hook's header", got, ev)
				}
			}
			if notified.Load() != 1 {
				t.Errorf("notified %d times, want 1", notified.Load())
			}

			// Rolled back: neither.
			rolled := events(1, "order.created", 1)
			if _, err := e.execWith(t, false, insert, []any{"o-2", 1}, rolled...); err != nil {
				t.Fatal(err)
			}
			if _, err := e.box.Get(context.Background(), rolled[0].ID); !errors.Is(err, core.ErrEventNotFound) {
				t.Errorf("rolled-back event: Get = %v, want ErrNotFound", err)
			}

			// A failing statement (duplicate key) writes no event and
			// tells no one.
			failed := events(1, "order.created", 1)
			if _, err := e.execWith(t, true, insert, []any{"o-1", 7}, failed...); err == nil {
				t.Fatal("duplicate order accepted")
			}
			if _, err := e.box.Get(context.Background(), failed[0].ID); !errors.Is(err, core.ErrEventNotFound) {
				t.Errorf("event of a failed statement: Get = %v, want ErrNotFound", err)
			}
			// Twice: the committed and the rolled-back statement (the
			// Notifier is told before the commit, like Enqueue's).
			if notified.Load() != 2 {
				t.Errorf("notified %d times after a failed statement, want 2", notified.Load())
			}

			// An invalid event fails before the statement runs.
			if _, err := e.execWith(t, true, insert, []any{"o-3", 3}, core.Event{Payload: []byte(`{}`)}); !errors.Is(err, core.ErrInvalidEvent) {
				t.Errorf("event without a type: %v, want ErrInvalidEvent", err)
			}
			if got := e.count(t, "SELECT count(*) FROM orders"); got != 1 {
				t.Errorf("%d orders, want 1", got)
			}

			// More events than one INSERT takes go through Enqueue first.
			many := events(dialect.MaxInsertRows+1, "order.created", 10)
			if _, err := e.execWith(t, true, insert, []any{"o-4", 4}, many...); err != nil {
				t.Fatal(err)
			}
			if got := e.count(t, "SELECT count(*) FROM "+e.box.Queries().Table().String()); got != 2+len(many) {
				t.Errorf("%d events stored, want %d", got, 2+len(many))
			}
			// No events: the statement alone.
			if n, err := e.execWith(t, true, insert, []any{"o-5", 5}); err != nil || n != 1 {
				t.Errorf("no events: %d, %v", n, err)
			}
		})
	}
}

// On PostgreSQL the events ride on the statement, whatever its kind, and
// the statement's own placeholders and WITH clause keep their meaning.
func TestExecWithEventsStatementsPostgres(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backends[0], sqlxoutbox.Options{})
	ctx := context.Background()
	table := e.box.Queries().Table().String()
	mustExec(t, e.db, "INSERT INTO orders (id, total) VALUES ('o-1', 1), ('o-2', 2)")

	cases := []struct {
		name, query string
		args        []any
		affected    int64
	}{
		{"update", "UPDATE orders SET total = $1 WHERE id = $2", []any{10, "o-1"}, 1},
		{"update of no row", "UPDATE orders SET total = $1 WHERE id = $2", []any{10, "o-404"}, 0},
		{"delete", "  \n\tdelete FROM orders WHERE id = $1", []any{"o-2"}, 1},
		{"with", "WITH v AS (SELECT CAST($1 AS text) AS id, CAST($2 AS int) AS total) INSERT INTO orders (id, total) SELECT id, total FROM v", []any{"o-3", 3}, 1},
		{"with recursive", "with recursive n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) INSERT INTO orders (id, total) SELECT 'r-' || i, i FROM n", []any{3}, 3},
		{"select", "SELECT total FROM orders WHERE id = $1", []any{"o-1"}, 1},
		{"hostile values", "INSERT INTO orders (id, total) VALUES ($1, $2)", []any{"o-'$1;--", 5}, 1},
	}
	written := 0
	for _, c := range cases {
		ev := core.Event{EventType: "order.changed", AggregateID: "$1 ' \" $2", Payload: []byte(`{"text": "$1) ; DROP TABLE orders; --"}`)}
		evs := []core.Event{ev, ev}
		n, err := e.execWith(t, true, c.query, c.args, evs...)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		written += 2
		if n != c.affected {
			t.Errorf("%s: %d rows affected, want %d", c.name, n, c.affected)
		}
		for _, ev := range evs {
			got := e.get(t, ev.ID)
			if got.AggregateID != ev.AggregateID || got.EventType != ev.EventType {
				t.Errorf("%s: stored %+v", c.name, got)
			}
		}
	}
	// The events of a statement that affected no row are written all the
	// same: they belong to the transaction, not to the rows.
	if got := e.count(t, "SELECT count(*) FROM "+table); got != written {
		t.Errorf("%d events stored, want %d", got, written)
	}
	var total int
	if err := e.db.GetContext(ctx, &total, "SELECT total FROM orders WHERE id = 'o-1'"); err != nil || total != 10 {
		t.Errorf("o-1 total %d, %v; want 10", total, err)
	}

	// Statements that cannot carry the INSERT are refused before anything
	// runs.
	for _, q := range []string{
		"CREATE TABLE x (id int)",
		"-- a comment first\nINSERT INTO orders (id, total) VALUES ($1, $2)",
		"WITH",
		"",
	} {
		ev := core.Event{EventType: "x", Payload: []byte(`{}`)}
		if _, err := e.execWith(t, true, q, []any{"o-9", 9}, ev); !errors.Is(err, dialect.ErrNotAttachable) {
			t.Errorf("%q: %v, want ErrNotAttachable", q, err)
		}
	}
	if got := e.count(t, "SELECT count(*) FROM "+table); got != written {
		t.Errorf("%d events stored after refused statements, want %d", got, written)
	}
}

func mustExec(t *testing.T, db *sqlx.DB, query string) {
	t.Helper()
	if _, err := db.Exec(query); err != nil {
		t.Fatal(err)
	}
}
