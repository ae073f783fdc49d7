package ordered_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"testing"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

func testLogger(t testing.TB) *slog.Logger { return testenv.Logger(t, slog.LevelInfo) }

// migrated opens a fresh, migrated database of d (ordered mode's schema
// is part of the default migrations).
func migrated(t testing.TB, d dialect.Dialect) *sql.DB {
	t.Helper()
	var db *sql.DB
	if d == dialect.SQLite {
		var err error
		db, err = sql.Open("sqlite", "file:"+t.TempDir()+"/outbox.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_txlock=immediate")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
	} else if d == dialect.MySQL {
		db = testenv.OpenMySQL(t)
	} else {
		db = testenv.OpenPostgres(t)
	}
	ctx := context.Background()
	opts := dialect.MigrateOptions{SkipInbox: true, Logger: slog.New(slog.DiscardHandler)}
	if err := dialect.Migrate(ctx, db, d, opts); err != nil {
		t.Fatal(err)
	}
	// Idempotent: a second run applies nothing.
	if err := dialect.Migrate(ctx, db, d, opts); err != nil {
		t.Fatal(err)
	}
	return db
}

// enqueue writes events in order, in one transaction per
// dialect.MaxInsertRows, and returns them with Seq set.
func enqueue(t testing.TB, db *sql.DB, d dialect.Dialect, evs []core.Event) []core.Event {
	t.Helper()
	box, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Dialect: d, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for start := 0; start < len(evs); start += dialect.MaxInsertRows {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := box.Enqueue(ctx, tx, evs[start:min(start+dialect.MaxInsertRows, len(evs))]...); err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	return evs
}

// sqlDialects are the databases whose stores serve leased ordered claims.
var sqlDialects = []dialect.Dialect{dialect.Postgres, dialect.MySQL}

// forDialects runs fn for every dialect of sqlDialects, in parallel.
func forDialects(t *testing.T, fn func(t *testing.T, d dialect.Dialect)) {
	t.Helper()
	for _, d := range sqlDialects {
		t.Run(d.Name(), func(t *testing.T) {
			t.Parallel()
			fn(t, d)
		})
	}
}

// events makes perAgg events for each aggregate, interleaved: a0 b0 a1 b1 ...
func events(aggs []string, perAgg int) []core.Event {
	var evs []core.Event
	for i := range perAgg {
		for _, a := range aggs {
			ev, err := core.NewEvent("test", a, "ordered.test", map[string]any{"agg": a, "n": i})
			if err != nil {
				panic(err)
			}
			evs = append(evs, ev)
		}
	}
	return evs
}

func aggNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("agg-%d", i)
	}
	return out
}

func newStore(t testing.TB, db *sql.DB, d dialect.Dialect) *sqlxoutbox.Outbox {
	t.Helper()
	s, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Dialect: d, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func claim(t testing.TB, s core.Store, req core.ClaimRequest) core.Claim {
	t.Helper()
	c, err := s.Claim(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func seqsOf(evs []core.Event) []int64 {
	out := make([]int64, len(evs))
	for i, ev := range evs {
		out[i] = ev.Seq
	}
	return out
}

func allOrdered(n int, policy core.DeadLetterPolicy) *core.OrderedClaim {
	return &core.OrderedClaim{PartitionCount: n, DeadLetter: policy}
}

// checkFirstDeliveryOrder reports the first place where an aggregate's
// first deliveries are not in Seq order, and counts duplicates.
func checkFirstDeliveryOrder(got []core.Event) (dups int, err error) {
	seen := map[string]bool{}
	last := map[string]int64{}
	for _, ev := range got {
		if seen[ev.ID] {
			dups++
			continue
		}
		seen[ev.ID] = true
		if ev.Seq < last[ev.AggregateID] {
			return dups, fmt.Errorf("aggregate %s: seq %d first delivered after %d", ev.AggregateID, ev.Seq, last[ev.AggregateID])
		}
		last[ev.AggregateID] = ev.Seq
	}
	return dups, nil
}
