package console_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/console"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// Every page, and a group retry, on every database the stores support,
// through the stores' own queries: PostgreSQL, MariaDB and SQLite. The
// events get their states the way production gives them: a relay
// publishes some and dead-letters others (a permanent error).
func TestConsoleOnEveryDatabase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		open func(t *testing.T) (*sql.DB, dialect.Dialect)
	}{
		{"postgres", func(t *testing.T) (*sql.DB, dialect.Dialect) { return testenv.OpenPostgres(t), dialect.Postgres }},
		{"mariadb", func(t *testing.T) (*sql.DB, dialect.Dialect) { return testenv.OpenMySQL(t), dialect.MySQL }},
		{"sqlite", func(t *testing.T) (*sql.DB, dialect.Dialect) {
			return fixtures.OpenSQLite(t, t.TempDir()+"/console.db").DB, dialect.SQLite
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, d := tc.open(t)
			pagesOn(t, db, d)
		})
	}
}

func pagesOn(t *testing.T, db *sql.DB, d dialect.Dialect) {
	ctx := t.Context()
	// With the opt-in lookup indexes, which every database must take.
	if err := dialect.Migrate(ctx, db, d, dialect.MigrateOptions{LookupIndexes: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	box, err := sqlxoutbox.New(sqlx.NewDb(db, map[dialect.Dialect]string{dialect.Postgres: "pgx", dialect.MySQL: "mysql", dialect.SQLite: "sqlite"}[d]),
		sqlxoutbox.Options{Dialect: d, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(eventType, agg string, n int) []core.Event {
		evs := make([]core.Event, n)
		for i := range evs {
			evs[i], _ = core.NewEvent("order", fmt.Sprintf("%s-%d", agg, i), eventType, map[string]int{"n": i})
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := box.Enqueue(ctx, tx, evs...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		return evs
	}
	published := enqueue("order.created", "c", 20)
	enqueue("order.paid", "p", 6)
	// The broker refuses order.paid for good: dead at the first attempt.
	pub := core.PublisherFunc(func(_ context.Context, evs []core.Event) error {
		be := core.NewBatchError(len(evs))
		for i, ev := range evs {
			if ev.EventType == "order.paid" {
				be.Errs[i] = core.Permanent(fmt.Errorf("broker refused event %s: 403", ev.ID))
			}
		}
		return be.ErrOrNil()
	})
	relay, err := core.NewRelay(box, pub, core.RelayOptions{Logger: quiet, Ordering: core.OrderingOff})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	enqueue("order.created", "q", 3) // pending
	in, err := sqlinbox.New(db, sqlinbox.Options{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"billing", "shipping"} {
		if _, err := in.Process(ctx, c, published[0].ID, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}

	c, err := console.New(box, console.Options{Logger: quiet, Inbox: in})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	page := func(path string) string {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	if body := page("/"); !strings.Contains(body, `id="pending">3<`) || !strings.Contains(body, `id="dead">6<`) {
		t.Errorf("overview: want 3 pending and 6 dead\n%s", body)
	}
	key := console.GroupKey("order.paid", "txoutbox: permanent failure: broker refused event <id>: <n>")
	body := page("/dead")
	if !strings.Contains(body, key) || !strings.Contains(body, ">6</td>") {
		t.Errorf("dead letters: want the order.paid group of 6 (key %s)\n%s", key, body)
	}
	if body := page("/dead/events?group=" + key); strings.Count(body, `name="seq"`) != 6 {
		t.Errorf("the group's page lists %d events, want 6", strings.Count(body, `name="seq"`))
	}
	if body := page("/events?type=order.created&state=published"); strings.Count(body, `<td>order.created</td>`) != 20 {
		t.Errorf("published order.created: %d rows, want 20", strings.Count(body, `<td>order.created</td>`))
	}
	if body := page(fmt.Sprintf("/events/%d", published[0].Seq)); !strings.Contains(body, published[0].ID) {
		t.Errorf("event %d's page lacks its ID", published[0].Seq)
	}
	if body := page("/events?id=" + published[0].ID); !strings.Contains(body, published[0].ID) {
		t.Error("looking the event up by ID does not lead to it")
	}
	if body := page("/ordered"); !strings.Contains(body, "dead event blocks it") {
		t.Errorf("ordered: the dead order.paid aggregates are not shown held\n%s", body)
	}
	if body := page("/inbox?event_id=" + published[0].ID); strings.Count(body, `class="ok"`) != 2 {
		t.Errorf("inbox lookup: want billing and shipping\n%s", body)
	}

	// A window bounds the grouping to the latest dead letters.
	gs, err := box.DeadGroups(ctx, 4, 10)
	if err != nil {
		t.Fatal(err)
	}
	var windowed int64
	for _, g := range gs {
		windowed += g.Count
	}
	if windowed != 4 {
		t.Errorf("DeadGroups with a window of 4 counted %d dead letters", windowed)
	}
	if held, err := box.HeldAggregates(ctx, 200); err != nil || len(held) != 6 || !held[0].Dead {
		t.Errorf("HeldAggregates: %d aggregates (want the 6 dead order.paid ones), %v", len(held), err)
	}

	// Retry the group through the console's form, confirmed.
	csrf := body[strings.Index(body, `name="csrf" value="`)+len(`name="csrf" value="`):]
	csrf = csrf[:strings.IndexByte(csrf, '"')]
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.PostForm(srv.URL+"/dead/action", url.Values{"action": {"retry"}, "group": {key}, "confirm": {"yes"}, "csrf": {csrf}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("retry: %d", resp.StatusCode)
	}
	dead, err := box.ListDead(ctx, dialect.DeadFilter{}, dialect.Page{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 0 {
		t.Errorf("%d dead events after the group retry, want 0", len(dead))
	}
	if _, err := box.GetBySeq(ctx, published[0].Seq); errors.Is(err, core.ErrEventNotFound) {
		t.Error("the published event went missing")
	}
}
