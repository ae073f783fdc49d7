package gormoutbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// BenchmarkCreateOrder measures orders/s creating one order per transaction
// on PostgreSQL, three ways in the same run and on the same table:
//
//   - raw: database/sql, INSERT order + the dialect's outbox INSERT in one
//     transaction (the yardstick of PERFORMANCE-LIMITS.md);
//   - gorm: db.Create of a model without events, no outbox;
//   - gorm+outbox: db.Create of a model with one order.created event
//     through the Plugin.
//
// The three alternate in rounds of 64 orders, so that drift of the shared
// machine hits them alike; each reports orders per second of its own wall
// time, and outbox/gorm is the cost of the outbox callback. One op is one
// order of each kind.
func BenchmarkCreateOrder(b *testing.B) {
	for _, clients := range []int{1, 4} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			sqlDB, _ := backends[0].open(b)
			sqlDB.SetMaxOpenConns(clients + 2)
			sqlDB.SetMaxIdleConns(clients + 2)
			ctx := context.Background()
			if err := dialect.Migrate(ctx, sqlDB, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: discardLogger()}); err != nil {
				b.Fatal(err)
			}
			open := func() *gorm.DB {
				db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
				if err != nil {
					b.Fatal(err)
				}
				return db
			}
			plain, outboxed := open(), open()
			if err := outboxed.Use(gormoutbox.Plugin{}); err != nil {
				b.Fatal(err)
			}
			if err := plain.AutoMigrate(&order{}); err != nil {
				b.Fatal(err)
			}
			q, err := dialect.Postgres.Queries("")
			if err != nil {
				b.Fatal(err)
			}

			kinds := []struct {
				name string
				run  func(i int) error
			}{
				{"raw", func(i int) error {
					tx, err := sqlDB.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					var id int64
					var created time.Time
					if err := tx.QueryRowContext(ctx, "INSERT INTO orders (buyer_id, total, status, created_at, updated_at) VALUES ($1, $2, '', now(), now()) RETURNING id, created_at",
						"buyer", i).Scan(&id, &created); err != nil {
						return err
					}
					ev, err := core.NewEvent("order", fmt.Sprint(id), "order.create",
						orderPayload{OrderID: id, BuyerID: "buyer", Total: int64(i), CreatedAt: created})
					if err != nil {
						return err
					}
					evs := []core.Event{ev}
					if err := core.PrepareEvents(ctx, evs, core.Limits{}, nil); err != nil {
						return err
					}
					query, args, err := q.Insert(evs)
					if err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, query, args...); err != nil {
						return err
					}
					return tx.Commit()
				}},
				{"gorm", func(i int) error { return plain.Create(&plainOrder{BuyerID: "buyer", Total: int64(i)}).Error }},
				{"gorm+outbox", func(i int) error { return outboxed.Create(&order{BuyerID: "buyer", Total: int64(i)}).Error }},
			}
			const round = 64
			elapsed := make([]time.Duration, len(kinds))
			b.ResetTimer()
			for done := 0; done < b.N; done += round {
				n := min(round, b.N-done)
				for k, kind := range kinds {
					start := time.Now()
					var next atomic.Int64
					var wg sync.WaitGroup
					var failed atomic.Value
					for range clients {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := next.Add(1); i <= int64(n); i = next.Add(1) {
								if err := kind.run(done + int(i)); err != nil {
									failed.Store(err)
									return
								}
							}
						}()
					}
					wg.Wait()
					elapsed[k] += time.Since(start)
					if err, _ := failed.Load().(error); err != nil {
						b.Fatalf("%s: %v", kind.name, err)
					}
				}
			}
			b.StopTimer()
			rate := make([]float64, len(kinds))
			for k, kind := range kinds {
				rate[k] = float64(b.N) / elapsed[k].Seconds()
				b.ReportMetric(rate[k], kind.name+"-orders/s")
			}
			b.ReportMetric(rate[2]/rate[1], "outbox/gorm")
			b.ReportMetric(rate[2]/rate[0], "outbox/raw")
		})
	}
}
