package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/console"
	"github.com/txoutbox/txoutbox/dialect"
)

const consoleTable = "console_events"

// consoleScenario runs scenario v: every page of the operations console
// against a table holding Retained published events, a fiftieth as many
// dead ones (100k with the default 5M) in a few error groups, and some
// pending ones; each page is loaded several times through the console's
// handler in this process, and the row is its median time (the database's
// queries and the rendering, no network).
func (b *bench) consoleScenario(ctx context.Context) ([]row, error) {
	box, err := b.outbox(ctx, b.db, consoleTable, sqlxoutbox.Options{})
	if err != nil {
		return nil, err
	}
	dead := b.c.Retained / 50
	if _, err := b.db.ExecContext(ctx, "TRUNCATE "+consoleTable); err != nil {
		return nil, err
	}
	b.log.Info("console: filling", "published", b.c.Retained, "dead", dead)
	const chunk = 500_000
	for from := 1; from <= b.c.Retained; from += chunk {
		if _, err := b.db.ExecContext(ctx, "INSERT INTO "+consoleTable+" (event_id, aggregate_type, aggregate_id, event_type, payload, created_at, published_at, attempt_count)"+
			" SELECT gen_random_uuid(), 'order', 'o-' || (g % 100000), (ARRAY['order.created','order.paid','order.shipped'])[1 + g % 3], "+payloadSQL("g")+","+
			" now() - interval '1 day' + g * interval '10 ms', now() - interval '1 day' + g * interval '10 ms' + interval '5 ms', 1"+
			" FROM generate_series($1::int, $2::int) AS g", from, min(from+chunk-1, b.c.Retained)); err != nil {
			return nil, err
		}
	}
	if _, err := b.db.ExecContext(ctx, "INSERT INTO "+consoleTable+" (event_id, aggregate_type, aggregate_id, event_type, payload, attempt_count, last_error, dead_at)"+
		" SELECT gen_random_uuid(), 'order', 'd-' || g, (ARRAY['order.paid','order.refunded'])[1 + g % 2], '{}', 10,"+
		" (ARRAY['broker refused event ' || gen_random_uuid() || ': 403', 'payload too large (' || (300000 + g) || ' bytes)', 'timeout after ' || (g % 30) || 's'])[1 + g % 3],"+
		" now() - g * interval '1 s' FROM generate_series(1, $1::int) AS g", dead); err != nil {
		return nil, err
	}
	if _, err := b.db.ExecContext(ctx, "INSERT INTO "+consoleTable+" (event_id, aggregate_type, aggregate_id, event_type, payload)"+
		" SELECT gen_random_uuid(), 'order', 'p-' || g, 'order.created', '{}' FROM generate_series(1, 1000) AS g"); err != nil {
		return nil, err
	}
	if _, err := b.db.ExecContext(ctx, "VACUUM ANALYZE "+consoleTable); err != nil {
		return nil, err
	}
	c, err := console.New(box, console.Options{Logger: b.quiet})
	if err != nil {
		return nil, err
	}
	var someID string
	var someSeq int64
	if err := b.db.QueryRowContext(ctx, "SELECT event_id::text, id FROM "+consoleTable+" WHERE id = (SELECT max(id) / 2 FROM "+consoleTable+")").Scan(&someID, &someSeq); err != nil {
		return nil, err
	}
	groupKey := base64.RawURLEncoding.EncodeToString([]byte("order.paid\x00payload too large (<n> bytes)")) // the console's group key
	pages := []struct{ name, path string }{
		{"overview", "/"},
		{"dead letters, grouped", "/dead"},
		{"one dead-letter group", "/dead/events?group=" + url.QueryEscape(groupKey)},
		{"events, newest", "/events"},
		{"events of one type", "/events?type=order.paid"},
		{"events, dead", "/events?state=dead"},
		{"event detail", fmt.Sprintf("/events/%d", someSeq)},
		{"event by ID (no index on event_id)", "/events?id=" + someID},
		{"events of one aggregate (no index on aggregate_id)", "/events?aggregate_id=o-4242"},
		{"ordered mode's held aggregates", "/ordered"},
	}
	size := fmt.Sprintf("%s published, %s dead", count(b.c.Retained), count(dead))
	measure := func(name, path string) (row, error) {
		var ds []time.Duration
		for range 5 {
			req := httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil)
			rec := httptest.NewRecorder()
			t0 := time.Now()
			c.ServeHTTP(rec, req)
			ds = append(ds, time.Since(t0))
			if rec.Code != http.StatusOK && rec.Code != http.StatusSeeOther {
				return row{}, fmt.Errorf("console %s: %d %s", path, rec.Code, rec.Body.String())
			}
		}
		slices.Sort(ds)
		med := ms(ds[len(ds)/2])
		b.log.Info("console page", "page", name, "median", ds[len(ds)/2], "max", ds[len(ds)-1])
		return row{name: "v  console page: " + name + " (" + size + "), median of 5 loads",
			value: med, unit: "ms", target: "≤ 100 ms", pass: med <= 100, verdict: true}, nil
	}
	rows := make([]row, 0, len(pages)+2)
	for _, p := range pages {
		r, err := measure(p.name, p.path)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	// The two lookups again with the opt-in lookup indexes
	// (txoutbox migrate --lookup-indexes).
	if err := dialect.Migrate(ctx, b.db, dialect.Postgres, dialect.MigrateOptions{Table: consoleTable, SkipInbox: true,
		LookupIndexes: true, Logger: b.quiet}); err != nil {
		return nil, err
	}
	if _, err := b.db.ExecContext(ctx, "ANALYZE "+consoleTable); err != nil {
		return nil, err
	}
	for _, p := range []struct{ name, path string }{
		{"event by ID, with the lookup indexes", "/events?id=" + someID},
		{"events of one aggregate, with the lookup indexes", "/events?aggregate_id=o-4242"},
	} {
		r, err := measure(p.name, p.path)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}
