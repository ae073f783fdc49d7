package relaygroup_test

import (
	"context"
	"database/sql"
	"strconv"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/tier"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/relaygroup"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// One of ten outboxes' databases crashes mid-run (PostgreSQL stopped
// immediately, as by a power cut) and comes back. The other nine relays of
// the group publish on throughout, and no committed event of any outbox is
// lost.
func TestOneDatabaseCrashedNoneLost(t *testing.T) {
	tier.SkipShort(t)
	t.Parallel()
	const n = 10
	cluster := testenv.StartCluster(t)
	ctx := t.Context()
	type outbox struct {
		db  *sql.DB
		box *sqlxoutbox.Outbox
		rec *outboxtest.Recorder

		mu        sync.Mutex
		committed []string
	}
	obs := make([]*outbox, n)
	members := make([]relaygroup.Member, n)
	for i := range obs {
		dsn := testenv.PostgresDSN(t)
		if i == 0 {
			dsn = cluster.NewDatabase(t)
		}
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if err := dialect.Migrate(ctx, db, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: quiet}); err != nil {
			t.Fatal(err)
		}
		box, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		o := &outbox{db: db, box: box, rec: outboxtest.NewRecorder()}
		relay, err := core.NewRelay(box, o.rec, core.RelayOptions{Logger: quiet, PollInterval: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		obs[i], members[i] = o, relaygroup.Member{Name: "tenant-" + strconv.Itoa(i), Run: relay.Run}
	}
	g, err := relaygroup.New(relaygroup.Options{Logger: quiet, MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Set(members); err != nil {
		t.Fatal(err)
	}
	gctx, stopGroup := context.WithCancel(context.Background())
	groupDone := make(chan error, 1)
	go func() { groupDone <- g.Run(gctx) }()
	defer func() { stopGroup(); <-groupDone }()

	// Producers: 50 events/s per outbox; a write to the crashed database
	// fails, and only committed events count.
	pctx, stopProducers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, o := range obs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-pctx.Done():
					return
				case <-tick.C:
				}
				ev, err := core.NewEvent("order", strconv.Itoa(i%5), "order.created", map[string]int{"n": i})
				if err != nil {
					t.Error(err)
					return
				}
				tx, err := o.db.BeginTx(pctx, nil)
				if err != nil {
					continue
				}
				if err := o.box.Enqueue(pctx, tx, ev); err != nil {
					_ = tx.Rollback()
					continue
				}
				if tx.Commit() == nil {
					o.mu.Lock()
					o.committed = append(o.committed, ev.ID)
					o.mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(2 * time.Second)
	cluster.Crash(t)
	before := make([]int, n)
	for i, o := range obs {
		before[i] = o.rec.Distinct()
	}
	time.Sleep(3 * time.Second)
	for i, o := range obs[1:] {
		if got := o.rec.Distinct(); got <= before[i+1] {
			t.Errorf("tenant-%d published nothing while tenant-0's database was down (%d before, %d after)", i+1, before[i+1], got)
		}
	}
	cluster.Start(t)
	time.Sleep(2 * time.Second)
	stopProducers()
	wg.Wait()
	for i, o := range obs {
		o.mu.Lock()
		ids := o.committed
		o.mu.Unlock()
		lost := len(ids)
		_ = wait.Poll(t.Context(), "every event delivered", func() (bool, any) {
			lost = 0
			for _, id := range ids {
				if o.rec.Count(id) == 0 {
					lost++
				}
			}
			return lost == 0, lost
		})
		if lost > 0 || len(ids) == 0 {
			t.Errorf("tenant-%d: %d of %d committed events never published", i, lost, len(ids))
		} else {
			t.Logf("tenant-%d: %d committed, all published", i, len(ids))
		}
	}
}
