package seal_test

import (
	"context"
	"database/sql"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/seal"
	"github.com/txoutbox/txoutbox/testing/sqlfixture"
)

var benchPayload = []byte(`{"order_id":"o-1","customer":"c-977","total_cents":4200,"currency":"EUR","items":[{"sku":"sku-7","qty":2}],"note":"` + strings.Repeat("x", 60) + `"}`)

// BenchmarkSeal is the client CPU of sealing one event (the data key of
// the window made once).
func BenchmarkSeal(b *testing.B) {
	s := newSealer(b, seal.Options{Key: newKey(b, "k1")})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		ev := core.Event{ID: "0193a8a0-0000-7000-8000-000000000001", Payload: benchPayload}
		if err := s.Seal(ctx, &ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnqueueSealed is the producer's cost of sealing on durable
// PostgreSQL: transactions (a business row and its event) alternate
// between a plain Enqueue and one through the seal hook, on 8 clients,
// and sealed/plain is their throughput ratio in the same run.
func BenchmarkEnqueueSealed(b *testing.B) {
	fx := sqlfixture.Open(b, testenv.Env(b, "TXOUTBOX_PG_DSN"), sqlfixture.Options{SkipInbox: true})
	s := newSealer(b, seal.Options{Key: newKey(b, "k1")})
	boxes := [2]*sqlxoutbox.Outbox{}
	for i, hooks := range [][]core.EnqueueHook{nil, {s.Hook()}} {
		ob, err := sqlxoutbox.NewDB(fx.DB, sqlxoutbox.Options{Hooks: hooks})
		if err != nil {
			b.Fatal(err)
		}
		boxes[i] = ob
	}
	ctx := context.Background()
	var took, count [2]atomic.Int64
	var next atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := next.Add(1) % 2
			t0 := time.Now()
			if err := enqueueOne(ctx, fx.DB, boxes[k]); err != nil {
				b.Error(err)
				return
			}
			took[k].Add(int64(time.Since(t0)))
			count[k].Add(1)
		}
	})
	plain := float64(took[0].Load()) / float64(max(count[0].Load(), 1)) / 1e6
	sealed := float64(took[1].Load()) / float64(max(count[1].Load(), 1)) / 1e6
	b.ReportMetric(plain, "plain-ms/tx")
	b.ReportMetric(sealed, "sealed-ms/tx")
	b.ReportMetric(plain/sealed, "sealed/plain")
}

func enqueueOne(ctx context.Context, db *sql.DB, ob *sqlxoutbox.Outbox) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := ob.Enqueue(ctx, tx, core.Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.created", Payload: benchPayload}); err != nil {
		return err
	}
	return tx.Commit()
}
