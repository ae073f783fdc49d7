package sqlxoutbox_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// backend opens a fresh, empty database of one dialect for one test.
type backend struct {
	name string
	d    dialect.Dialect
	open func(t testing.TB) *sqlx.DB
}

var backends = []backend{
	{name: "postgres", d: dialect.Postgres, open: func(t testing.TB) *sqlx.DB {
		return sqlx.NewDb(testenv.OpenPostgres(t), "pgx")
	}},
	{name: "sqlite", d: dialect.SQLite, open: func(t testing.TB) *sqlx.DB {
		return openSQLite(t, filepath.Join(t.TempDir(), "outbox.db"))
	}},
	{name: "mariadb", d: dialect.MySQL, open: func(t testing.TB) *sqlx.DB {
		return sqlx.NewDb(testenv.OpenMySQL(t), "mysql")
	}},
}

func openSQLite(t testing.TB, path string) *sqlx.DB {
	t.Helper()
	return fixtures.OpenSQLite(t, path)
}

// env is one migrated database with an Outbox and an orders table, the
// business table the producers write next to their events.
type env struct {
	b   backend
	db  *sqlx.DB
	box *sqlxoutbox.Outbox
	s   *fixtures.SQLX
}

func forEach(t *testing.T, fn func(t *testing.T, e *env)) {
	t.Helper()
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			fn(t, newEnv(t, b, sqlxoutbox.Options{}))
		})
	}
}

func newEnv(t testing.TB, b backend, opts sqlxoutbox.Options) *env {
	t.Helper()
	s := fixtures.NewSQLX(t, b.open(t), b.d, fixtures.Options{Logger: quiet, OrdersColumn: "total", Store: opts})
	if s.Box.Dialect() != b.d {
		t.Fatalf("detected dialect %v, want %v", s.Box.Dialect(), b.d)
	}
	return &env{b: b, db: s.X, box: s.Box, s: s}
}

// rows counts the rows of the outbox table.
func (e *env) rows(t testing.TB) int {
	t.Helper()
	var n int
	if err := e.db.QueryRow("SELECT COUNT(*) FROM outbox_events").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// enqueue writes one order row and its events in one transaction, and
// commits or rolls back.
func (e *env) enqueue(t testing.TB, commit bool, evs ...core.Event) []core.Event {
	t.Helper()
	ctx := context.Background()
	tx, err := e.db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, e.db.Rebind("INSERT INTO orders (id, total) VALUES (?, ?)"), testenv.RandomSuffix(), 42); err != nil {
		t.Fatal(err)
	}
	if err := e.box.Enqueue(ctx, tx, evs...); err != nil {
		tx.Rollback()
		t.Fatalf("Enqueue: %v", err)
	}
	if commit {
		err = tx.Commit()
	} else {
		err = tx.Rollback()
	}
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// events makes n events of one type, spread over aggs aggregates.
func events(n int, eventType string, aggs int) []core.Event {
	evs := make([]core.Event, n)
	for i := range evs {
		evs[i] = core.Event{
			AggregateType: "order",
			AggregateID:   fmt.Sprintf("o-%d", i%max(aggs, 1)),
			EventType:     eventType,
			Payload:       []byte(fmt.Sprintf(`{"n": %d}`, i)),
			Headers:       map[string]string{"n": fmt.Sprint(i)},
		}
	}
	return evs
}

func (e *env) claim(t testing.TB, limit int) core.Claim {
	t.Helper()
	c, err := e.box.Claim(context.Background(), core.ClaimRequest{Limit: limit})
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	return c
}

func (e *env) get(t testing.TB, id string) core.Event {
	t.Helper()
	ev, err := e.box.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	return ev
}

// backdate moves an event's timestamps back by age, to test retention and
// lag without waiting.
func (e *env) backdate(ctx context.Context, id string, age time.Duration) error {
	return e.s.Backdate(ctx, id, age)
}

func seqsOf(evs []core.Event) []int64 {
	s := make([]int64, len(evs))
	for i := range evs {
		s[i] = evs[i].Seq
	}
	return s
}

// enqueueCommitted writes evs in a transaction of their own and commits.
func enqueueCommitted(t testing.TB, ctx context.Context, db *sqlx.DB, box *sqlxoutbox.Outbox, evs ...core.Event) {
	t.Helper()
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := box.Enqueue(ctx, tx, evs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}
