package relaygroup_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/relaygroup"
)

// countingStore counts the claims and next-due queries a store serves: a
// relay's idle cost.
type countingStore struct {
	core.Store
	claims, nextDue *atomic.Int64
}

func (s countingStore) Claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, req)
}

func (s countingStore) NextDue(ctx context.Context) (time.Duration, bool, error) {
	s.nextDue.Add(1)
	return s.Store.(core.NextDueReader).NextDue(ctx)
}

func (s countingStore) Unwrap() core.Store { return s.Store }

// outboxes migrates n outbox tables in one fresh PostgreSQL database and
// returns the pool they share and their stores.
func outboxes(b *testing.B, n int) (*sql.DB, []*sqlxoutbox.Outbox) {
	dsn := testenv.PostgresDSN(b)
	db := testenv.OpenPostgresDSN(b, dsn)
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	ctx := context.Background()
	boxes := make([]*sqlxoutbox.Outbox, n)
	for i := range boxes {
		table := "outbox_" + strconv.Itoa(i)
		if err := dialect.Migrate(ctx, db, dialect.Postgres, dialect.MigrateOptions{Table: table, SkipInbox: true, SkipOrdered: true, Logger: quiet}); err != nil {
			b.Fatal(err)
		}
		box, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Table: table, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		boxes[i] = box
	}
	return db, boxes
}

// BenchmarkIdleCost measures what 100 idle outboxes cost one process at
// the relays' defaults (one worker, one-second poll): goroutines and open
// connections, and the queries they send while nothing happens.
//
//	go test -run '^$' -bench BenchmarkIdleCost -benchtime 1x ./relaygroup/
func BenchmarkIdleCost(b *testing.B) {
	const n, idle = 100, 10 * time.Second
	for range b.N {
		db, boxes := outboxes(b, n)
		var claims, nextDue atomic.Int64
		before := runtime.NumGoroutine()
		g, err := relaygroup.New(relaygroup.Options{Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		members := make([]relaygroup.Member, n)
		for i, box := range boxes {
			r, err := core.NewRelay(countingStore{box, &claims, &nextDue}, core.PublisherFunc(func(context.Context, []core.Event) error { return nil }), core.RelayOptions{Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			members[i] = relaygroup.Member{Name: strconv.Itoa(i), Run: r.Run}
		}
		if err := g.Set(members); err != nil {
			b.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()
		time.Sleep(2 * time.Second) // the first claims
		c0, d0 := claims.Load(), nextDue.Load()
		time.Sleep(idle)
		goroutines := runtime.NumGoroutine() - before
		st := db.Stats()
		queries := float64(claims.Load()-c0+nextDue.Load()-d0) / idle.Seconds()
		stop()
		<-done
		b.ReportMetric(float64(goroutines)/n, "goroutines/outbox")
		b.ReportMetric(float64(st.OpenConnections), "connections")
		b.ReportMetric(queries/n, "idle-queries/s/outbox")
	}
}

// BenchmarkFairness measures the end-to-end latency of a quiet outbox
// (20 events/s) alone, then while another outbox of the same process and
// the same connection pool drains a backlog of 200,000 events
// (TXOUTBOX_FAIRNESS_BACKLOG=1000000 for a million). It reports the quiet
// outbox's p50 and p99 in both phases, and the drain's rate.
//
//	go test -run '^$' -bench BenchmarkFairness -benchtime 1x -timeout 30m ./relaygroup/
func BenchmarkFairness(b *testing.B) {
	backlog := 200_000
	if v, err := strconv.Atoi(os.Getenv("TXOUTBOX_FAIRNESS_BACKLOG")); err == nil && v > 0 {
		backlog = v
	}
	for range b.N {
		db, boxes := outboxes(b, 2)
		busy, quiet := boxes[0], boxes[1]
		var mu sync.Mutex
		sent := map[string]time.Time{}
		var lat []time.Duration
		var drained atomic.Int64
		pubQuiet := core.PublisherFunc(func(_ context.Context, evs []core.Event) error {
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			for _, ev := range evs {
				lat = append(lat, now.Sub(sent[ev.ID]))
			}
			return nil
		})
		pubBusy := core.PublisherFunc(func(_ context.Context, evs []core.Event) error { drained.Add(int64(len(evs))); return nil })
		rq, err := core.NewRelay(quiet, pubQuiet, core.RelayOptions{Logger: quietLog()})
		if err != nil {
			b.Fatal(err)
		}
		rb, err := core.NewRelay(busy, pubBusy, core.RelayOptions{Logger: quietLog()})
		if err != nil {
			b.Fatal(err)
		}
		g, err := relaygroup.New(relaygroup.Options{Logger: quietLog()})
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Set([]relaygroup.Member{{Name: "quiet", Run: rq.Run}}); err != nil {
			b.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()
		produce := func(d time.Duration) []time.Duration {
			mu.Lock()
			lat = nil
			mu.Unlock()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			end := time.Now().Add(d)
			n := 0
			for time.Now().Before(end) {
				<-tick.C
				ev, _ := core.NewEvent("order", "q", "order.created", map[string]int{"n": n})
				tx, err := db.Begin()
				if err != nil {
					b.Fatal(err)
				}
				mu.Lock()
				sent[ev.ID] = time.Now()
				mu.Unlock()
				if err := quiet.Enqueue(ctx, tx, ev); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
				n++
			}
			time.Sleep(time.Second)
			mu.Lock()
			defer mu.Unlock()
			out := slices.Clone(lat)
			slices.Sort(out)
			return out
		}
		alone := produce(5 * time.Second)
		if _, err := db.Exec(fmt.Sprintf(`INSERT INTO outbox_0 (event_id, aggregate_type, aggregate_id, event_type, payload)
			SELECT gen_random_uuid(), 'order', 'o-' || g, 'order.created', '{"n": 1}' FROM generate_series(1, %d) g`, backlog)); err != nil {
			b.Fatal(err)
		}
		if err := g.Set([]relaygroup.Member{{Name: "quiet", Run: rq.Run}, {Name: "busy", Run: rb.Run}}); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		var during []time.Duration
		for drained.Load() < int64(backlog) {
			during = append(during, produce(5*time.Second)...)
		}
		rate := float64(backlog) / time.Since(start).Seconds()
		stop()
		<-done
		slices.Sort(during)
		pct := func(xs []time.Duration, p int) float64 { return float64(xs[len(xs)*p/100].Microseconds()) / 1000 }
		b.ReportMetric(pct(alone, 50), "alone-p50-ms")
		b.ReportMetric(pct(alone, 99), "alone-p99-ms")
		b.ReportMetric(pct(during, 50), "during-p50-ms")
		b.ReportMetric(pct(during, 99), "during-p99-ms")
		b.ReportMetric(rate, "drain-events/s")
	}
}

func quietLog() *slog.Logger { return quiet }
