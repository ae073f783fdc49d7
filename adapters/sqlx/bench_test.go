package sqlxoutbox_test

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// benchBacklog is the number of events pre-filled before each drain: big
// enough for a steady rate, small enough for a run under a minute.
const benchBacklog = 20_000

// A ~210-byte payload, as in PERFORMANCE-LIMITS.md.
const benchPayloadSQL = `jsonb_build_object('order_id', 'o-' || g, 'customer', 'c-' || (g % 977), 'total_cents', g * 7,
	'currency', 'EUR', 'items', jsonb_build_array(jsonb_build_object('sku', 'sku-' || (g % 31), 'qty', 1 + g % 3)),
	'note', repeat('x', 60))`

// BenchmarkDrain measures, in the same run on the same table, the events/s
// of core.Relay draining a pre-filled backlog through the sqlx Outbox into an
// in-memory publisher (batch 100, one worker), and of the hand-written raw
// SQL loop it is built on (BEGIN; SELECT ... LIMIT 100 FOR UPDATE SKIP
// LOCKED; UPDATE ... WHERE id = ANY($1); COMMIT). The two alternate batch by
// batch on one backlog of 2 x 20k events, so that both see the same load on
// a shared machine; relay/raw is the ratio of their rates.
//
//	go test -run '^$' -bench 'Drain$' -benchtime 5x ./adapters/sqlx/
func BenchmarkDrain(b *testing.B) {
	e := newEnv(b, backends[0], sqlxoutbox.Options{})
	ctx := context.Background()
	var published int
	pub := core.PublisherFunc(func(_ context.Context, evs []core.Event) error {
		published += len(evs)
		return nil
	})
	relay, err := core.NewRelay(e.box, pub, core.RelayOptions{BatchSize: 100, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	var relayTime, rawTime time.Duration
	var relayN, rawN int
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		fillBacklog(b, e.db.DB, 2*benchBacklog)
		b.StartTimer()
		relayDone, rawDone := false, false
		for !relayDone || !rawDone {
			if !relayDone {
				start := time.Now()
				res, err := relay.ProcessBatch(ctx)
				relayTime += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				relayN += int(res.Published)
				relayDone = res.Claimed == 0
			}
			if !rawDone {
				start := time.Now()
				n := rawBatch(b, e.db.DB)
				rawTime += time.Since(start)
				rawN += n
				rawDone = n == 0
			}
		}
		if published != relayN {
			b.Fatalf("relay published %d, counted %d", published, relayN)
		}
	}
	if relayN+rawN != b.N*2*benchBacklog {
		b.Fatalf("drained %d + %d events, want %d", relayN, rawN, b.N*2*benchBacklog)
	}
	relayRate := float64(relayN) / relayTime.Seconds()
	rawRate := float64(rawN) / rawTime.Seconds()
	b.ReportMetric(relayRate, "relay-events/s")
	b.ReportMetric(rawRate, "raw-events/s")
	b.ReportMetric(relayRate/rawRate, "relay/raw")
	b.ReportMetric(0, "ns/op") // an op is a drain of both; the rates are the result
}

// BenchmarkDrainSQLite is the relay's drain rate on SQLite (WAL, one
// worker), for comparison with PostgreSQL.
func BenchmarkDrainSQLite(b *testing.B) {
	e := newEnv(b, backends[1], sqlxoutbox.Options{})
	ctx := context.Background()
	relay, err := core.NewRelay(e.box, core.PublisherFunc(func(context.Context, []core.Event) error { return nil }),
		core.RelayOptions{BatchSize: 100, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	var elapsed time.Duration
	for range b.N {
		b.StopTimer()
		if _, err := e.db.ExecContext(ctx, "DELETE FROM outbox_events"); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < benchBacklog; i += dialect.MaxInsertRows {
			if err := e.box.Enqueue(ctx, e.db, events(dialect.MaxInsertRows, "bench", 100)...); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		start := time.Now()
		res, err := relay.Drain(ctx)
		if err != nil || res.Published != benchBacklog {
			b.Fatalf("drained %+v, %v", res, err)
		}
		elapsed += time.Since(start)
	}
	b.ReportMetric(float64(b.N*benchBacklog)/elapsed.Seconds(), "relay-events/s")
	b.ReportMetric(0, "ns/op")
}

// fillBacklog empties the table and writes n pending events in one
// statement, then vacuums, so that every drain starts from the same state.
func fillBacklog(b *testing.B, db *sql.DB, n int) {
	b.Helper()
	ctx := context.Background()
	for _, s := range []string{
		"TRUNCATE outbox_events",
		"INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, payload, headers)" +
			" SELECT gen_random_uuid(), 'order', 'o-' || (g % 1000), 'order.created', " + benchPayloadSQL + ", '{\"tenant\": \"acme\"}'" +
			" FROM generate_series(1, " + strconv.Itoa(n) + ") AS g",
		"VACUUM ANALYZE outbox_events",
	} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
}

// rawBatch is the baseline: one batch of the claim and mark statements
// written by hand, reading the same columns a relay needs, without the
// Outbox or the Relay. It returns how many events it marked.
func rawBatch(b *testing.B, db *sql.DB) int {
	b.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	rows, err := tx.QueryContext(ctx, "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload, headers,"+
		" created_at, attempt_count FROM outbox_events"+
		" WHERE published_at IS NULL AND dead_at IS NULL AND next_attempt_at <= now()"+
		" ORDER BY next_attempt_at, id LIMIT 100 FOR UPDATE SKIP LOCKED")
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]int64, 0, 100)
	for rows.Next() {
		var (
			id                          int64
			eventID, aggType, aggID, et string
			payload, headers            []byte
			created                     time.Time
			attempts                    int
		)
		if err := rows.Scan(&id, &eventID, &aggType, &aggID, &et, &payload, &headers, &created, &attempts); err != nil {
			b.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	if len(ids) == 0 {
		tx.Rollback()
		return 0
	}
	if _, err := tx.ExecContext(ctx, "UPDATE outbox_events SET published_at = now(), attempt_count = attempt_count + 1 WHERE id = ANY($1)", ids); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	return len(ids)
}

// BenchmarkEnqueue measures the producer's write path on PostgreSQL: one
// transaction with an orders row and one ~200-byte event, from 8 concurrent
// clients. Every client alternates between Outbox.Enqueue and a hand-written
// INSERT, so that both see the same load (the machine is shared); the
// metrics are the mean latency of each kind and outbox/raw, the ratio of
// their throughputs at equal concurrency (raw latency / outbox latency).
//
//	go test -run '^$' -bench Enqueue -benchtime 4000x ./adapters/sqlx/
func BenchmarkEnqueue(b *testing.B) {
	e := newEnv(b, backends[0], sqlxoutbox.Options{})
	e.db.SetMaxOpenConns(8)
	ctx := context.Background()
	payload := []byte(`{"order_id":"o-1","customer":"c-977","total_cents":4200,"currency":"EUR","items":[{"sku":"sku-7","qty":2}],"note":"` + strings.Repeat("x", 60) + `"}`)
	const rawInsert = "INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, payload, headers)" +
		" VALUES ($1, $2, $3, $4, $5, $6)"
	writers := [2]func(tx *sql.Tx, id string) error{
		func(tx *sql.Tx, id string) error {
			return e.box.Enqueue(ctx, tx, core.Event{AggregateType: "order", AggregateID: id, EventType: "order.created", Payload: payload})
		},
		func(tx *sql.Tx, id string) error {
			_, err := tx.ExecContext(ctx, rawInsert, uuid.Must(uuid.NewV7()).String(), "order", id, "order.created", string(payload), "{}")
			return err
		},
	}
	var took, count [2]atomic.Int64
	var next atomic.Int64
	b.SetParallelism(4) // 8 clients on 2 cores
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := next.Add(1) % 2
			id := uuid.Must(uuid.NewV7()).String()
			t0 := time.Now()
			tx, err := e.db.BeginTx(ctx, nil)
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", id, 4200); err != nil {
				b.Error(err)
				return
			}
			if err := writers[k](tx, id); err != nil {
				b.Error(err)
				return
			}
			if err := tx.Commit(); err != nil {
				b.Error(err)
				return
			}
			took[k].Add(int64(time.Since(t0)))
			count[k].Add(1)
		}
	})
	b.ReportMetric(float64(count[0].Load()+count[1].Load())/time.Since(start).Seconds(), "tx/s")
	outbox := float64(took[0].Load()) / float64(max(count[0].Load(), 1)) / 1e6
	raw := float64(took[1].Load()) / float64(max(count[1].Load(), 1)) / 1e6
	b.ReportMetric(outbox, "outbox-ms/tx")
	b.ReportMetric(raw, "raw-ms/tx")
	b.ReportMetric(raw/outbox, "outbox/raw")
}
