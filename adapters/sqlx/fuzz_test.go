package sqlxoutbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"math/big"
	"strings"
	"sync"
	"testing"

	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// fuzzDB is one PostgreSQL database for every input of a fuzzing process.
var fuzzDB struct {
	once sync.Once
	db   *sqlx.DB
	box  *sqlxoutbox.Outbox
}

// FuzzValidEventsInsert proves the promise of core.Event.Validate and
// dialect.Postgres.CheckEvents against PostgreSQL itself: whatever event
// both accept, the outbox's INSERT takes, so that no bad input reaches the database and aborts the caller's
// transaction. `go test` runs the seeds; `go test -fuzz FuzzValidEventsInsert
// ./adapters/sqlx` explores (see docs/operations.md).
func FuzzValidEventsInsert(f *testing.F) {
	for _, s := range []struct{ payload, typ, agg, hk, hv string }{
		{`{"n":1}`, "order.created", "42", "tenant", "acme"},
		{`"\u0000"`, "t", "a", "k", "v"},
		{`"\\u0000"`, "t", "a", "k", "v"},
		{`"\ud83d\ude00"`, "t", "a", "k", "v"},
		{`"\ud800"`, "t", "a", "k", "v"},
		{`1e131071`, "t", "", "", ""},
		{`1e131072`, "t", "", "", ""},
		{`0.` + strings.Repeat("0", 16382) + `1`, "t", "", "", ""},
		{`[1e-16383, -0e999999999]`, "t", "", "", ""},
		{"\"\xff\"", "t", "a", "k", "v"},
		{`{"a":{"b":[[[[null]]]]}}`, "t\x00", "a", "k", "v"},
		{`{}`, "t", "a\xff", "k\x00", "v\xfe"},
		{`"\u2028\ufeff\uffff"`, "é", "日本", "ключ", "\U0001F600"},
	} {
		f.Add(s.payload, s.typ, s.agg, s.hk, s.hv)
	}
	f.Fuzz(func(t *testing.T, payload, typ, agg, hk, hv string) {
		ev := core.Event{EventType: typ, AggregateID: agg, AggregateType: agg, Payload: json.RawMessage(payload)}
		if hk != "" || hv != "" {
			ev.Headers = map[string]string{hk: hv}
		}
		if ev.Prepare() != nil || dialect.Postgres.CheckEvents([]core.Event{ev}) != nil {
			return // refused before the database: nothing to prove
		}
		fuzzDB.once.Do(func() {
			// A database shared by every input; it is dropped when the
			// first test that made it ends, so make it outside any.
			db, err := sql.Open("pgx", testenv.Env(t, "TXOUTBOX_PG_DSN"))
			if err != nil {
				t.Fatal(err)
			}
			if err := dialect.Migrate(context.Background(), db, dialect.Postgres, dialect.MigrateOptions{Table: "fuzz_outbox", SkipInbox: true, Logger: quiet}); err != nil {
				t.Fatal(err)
			}
			fuzzDB.db = sqlx.NewDb(db, "pgx")
			fuzzDB.box, err = sqlxoutbox.New(fuzzDB.db, sqlxoutbox.Options{Table: "fuzz_outbox", Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
		})
		if fuzzDB.box == nil {
			t.Fatal("no fuzz database")
		}
		ctx := context.Background()
		tx, err := fuzzDB.db.BeginTxx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback() // nothing is kept
		evs := []core.Event{ev}
		if err := fuzzDB.box.Enqueue(ctx, tx, evs...); err != nil {
			t.Fatalf("PostgreSQL refused an event Validate accepted: %v\npayload %q type %q aggregate %q header %q=%q", err, payload, typ, agg, hk, hv)
		}
		var stored string
		if err := tx.QueryRowContext(ctx, "SELECT payload::text FROM fuzz_outbox WHERE id = $1", evs[0].Seq).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if !jsonSame(stored, string(evs[0].Payload)) { // an empty payload is stored as null
			t.Fatalf("stored payload %q, want the same JSON as %q", stored, payload)
		}
	})
}

// jsonSame reports whether two JSON texts hold the same value: jsonb keeps
// the value and normalizes the text (numbers like 1e-5 come back as
// 0.00001), so numbers compare exactly as rationals.
func jsonSame(a, b string) bool {
	x, errA := decodeExact(a)
	y, errB := decodeExact(b)
	return errA == nil && errB == nil && sameValue(x, y)
}

func decodeExact(s string) (any, error) {
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

func sameValue(x, y any) bool {
	switch x := x.(type) {
	case json.Number:
		y, ok := y.(json.Number)
		if !ok {
			return false
		}
		rx, okx := new(big.Rat).SetString(string(x))
		ry, oky := new(big.Rat).SetString(string(y))
		return okx && oky && rx.Cmp(ry) == 0
	case []any:
		y, ok := y.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := y.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if w, ok := y[k]; !ok || !sameValue(v, w) {
				return false
			}
		}
		return true
	}
	return x == y
}
