package ordered_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/ordered"
)

type changeLog struct {
	mu sync.Mutex
	cs []ordered.LeaseChange
}

func (c *changeLog) add(ch ordered.LeaseChange) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cs = append(c.cs, ch)
}

func (c *changeLog) take() []ordered.LeaseChange {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.cs
	c.cs = nil
	return out
}

func newLeaser(t testing.TB, db *sql.DB, d dialect.Dialect, owner string, n int, ttl time.Duration, log *changeLog) *ordered.Leaser {
	t.Helper()
	opts := ordered.LeaserOptions{Owner: owner, PartitionCount: n, LeaseTTL: ttl, Logger: testLogger(t)}
	if log != nil {
		opts.OnChange = log.add
	}
	l, err := ordered.NewLeaser(db, d, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return l
}

func tick(t testing.TB, ls ...*ordered.Leaser) {
	t.Helper()
	for _, l := range ls {
		if err := l.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// checkDisjoint fails unless the leasers' partitions are disjoint, and
// returns how many they hold together.
func checkDisjoint(t testing.TB, ls ...*ordered.Leaser) int {
	t.Helper()
	seen := map[int]string{}
	for _, l := range ls {
		for _, p := range l.Held() {
			if o, ok := seen[p]; ok {
				t.Fatalf("partition %d held by %s and %s", p, o, l.Owner())
			}
			seen[p] = l.Owner()
		}
	}
	return len(seen)
}

func kinds(cs []ordered.LeaseChange, k ordered.LeaseChangeKind) (n int, from []string) {
	for _, c := range cs {
		if c.Kind == k {
			n++
			from = append(from, c.From)
		}
	}
	return n, from
}

// Acquire, rebalance on join, expiry takeover when a relay stops renewing,
// lost leases when it comes back, and rebalance again.
func TestLeaserAcquireRebalanceExpiryTakeover(t *testing.T) {
	t.Parallel()
	forDialects(t, func(t *testing.T, d dialect.Dialect) {
		for attempt := 1; !leaserScenario(t, d); attempt++ {
			t.Logf("attempt %d: a round of ticks took over half the lease TTL, so leases renewed at its start may have run out before the checks; the run says nothing about the leaser, again", attempt)
		}
	})
}

// leaserScenario is TestLeaserAcquireRebalanceExpiryTakeover's run on a
// database of its own. It reports false, having judged nothing since, as
// soon as a round of ticks outlasts half the TTL: the leases are real
// server-side leases on the wall clock, and a machine that slow lets them
// expire between a round and its checks.
func leaserScenario(t *testing.T, d dialect.Dialect) bool {
	db := migrated(t, d)
	const n = 8
	ttl := 3 * time.Second
	logA, logB := &changeLog{}, &changeLog{}
	a := newLeaser(t, db, d, "relay-a", n, ttl, logA)
	b := newLeaser(t, db, d, "relay-b", n, ttl, logB)
	round := func(ls ...*ordered.Leaser) bool {
		start := time.Now()
		tick(t, ls...)
		return time.Since(start) < ttl/2
	}

	if !round(a) {
		return false
	}
	if got := a.Held(); len(got) != n {
		t.Fatalf("single relay holds %v, want all %d partitions", got, n)
	}
	if c, _ := kinds(logA.take(), ordered.Acquired); c != n {
		t.Fatalf("%d acquisitions reported, want %d", c, n)
	}

	// b joins: nothing is free, so a must give up its excess first.
	if !round(b) {
		return false
	}
	if got := b.Held(); len(got) != 0 {
		t.Fatalf("b took %v while a's leases are live", got)
	}
	if !round(a, b) {
		return false
	}
	if len(a.Held()) != n/2 || len(b.Held()) != n/2 || checkDisjoint(t, a, b) != n {
		t.Fatalf("after rebalance a=%v b=%v, want %d each, disjoint", a.Held(), b.Held(), n/2)
	}
	if c, _ := kinds(logA.take(), ordered.Released); c != n/2 {
		t.Fatalf("a reported %d releases, want %d", c, n/2)
	}
	// Renewing keeps the split stable.
	before := b.Held()
	if !round(a, b, a, b) {
		return false
	}
	if !slices.Equal(b.Held(), before) {
		t.Fatalf("b's partitions moved from %v to %v without a join or leave", before, b.Held())
	}

	// a stops renewing (a crash): after the TTL b takes over everything,
	// and a no longer claims its partitions.
	logB.take()
	time.Sleep(ttl + 200*time.Millisecond)
	if got := a.Held(); got != nil {
		t.Fatalf("a still reports %v after its leases expired", got)
	}
	if !round(b) {
		return false
	}
	if len(b.Held()) != n {
		t.Fatalf("b holds %v after a's leases expired, want all", b.Held())
	}
	taken, from := kinds(logB.take(), ordered.Acquired)
	if taken != n/2 || b.Stats().Takeovers != n/2 {
		t.Fatalf("b took %d leases (%d takeovers), want %d", taken, b.Stats().Takeovers, n/2)
	}
	for _, f := range from {
		if f != "relay-a" {
			t.Fatalf("takeover from %q, want relay-a", f)
		}
	}

	// a comes back: its renewals find the leases gone.
	if !round(a) {
		return false
	}
	if lost, _ := kinds(logA.take(), ordered.Lost); lost != n/2 {
		t.Fatalf("a reported %d lost leases, want %d", lost, n/2)
	}
	checkDisjoint(t, a, b)
	if !round(b, a) {
		return false
	}
	if len(a.Held()) != n/2 || len(b.Held()) != n/2 || checkDisjoint(t, a, b) != n {
		t.Fatalf("after a's return a=%v b=%v, want %d each", a.Held(), b.Held(), n/2)
	}
	return true
}

// A relay that leaves cleanly releases at once: the others need not wait
// for the TTL.
func TestLeaserLeaveHandsOverAtOnce(t *testing.T) {
	t.Parallel()
	forDialects(t, func(t *testing.T, d dialect.Dialect) {
		db := migrated(t, d)
		const n = 9
		ttl := time.Hour // a takeover by expiry would never happen in time
		a := newLeaser(t, db, d, "a", n, ttl, nil)
		b := newLeaser(t, db, d, "b", n, ttl, nil)
		c := newLeaser(t, db, d, "c", n, ttl, nil)
		tick(t, a, b, c, a, b, c)
		if checkDisjoint(t, a, b, c) != n || len(a.Held()) != 3 || len(b.Held()) != 3 {
			t.Fatalf("three relays: a=%v b=%v c=%v, want 3 each", a.Held(), b.Held(), c.Held())
		}
		if err := c.Leave(context.Background()); err != nil {
			t.Fatal(err)
		}
		tick(t, a, b)
		if checkDisjoint(t, a, b) != n {
			t.Fatalf("after c left a=%v b=%v, want all %d covered", a.Held(), b.Held(), n)
		}
		leases, err := a.Leases(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, le := range leases {
			if !le.Live || le.Owner == "c" {
				t.Fatalf("lease %+v after c left", le)
			}
		}
	})
}

// Run renews, and a relay killed without leaving is replaced once its
// leases expire, never before.
func TestLeaserRunFailover(t *testing.T) {
	t.Parallel()
	forDialects(t, func(t *testing.T, d dialect.Dialect) {
		db := migrated(t, d)
		const n = 6
		ttl := time.Second
		a := newLeaser(t, db, d, "a", n, ttl, nil)
		b := newLeaser(t, db, d, "b", n, ttl, nil)
		actx, killA := context.WithCancel(context.Background())
		bctx, stopB := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _ = b.Run(bctx) }()
		aDone := make(chan struct{})
		var renewed atomic.Int64 // unix nanos: the start of a's last tick that renewed
		go func() {
			defer close(aDone)
			// a "dies": it ticks until killed, then never releases.
			for actx.Err() == nil {
				start := time.Now()
				if a.Tick(actx) == nil {
					renewed.Store(start.UnixNano())
				}
				select {
				case <-actx.Done():
				case <-time.After(ttl / 3):
				}
			}
		}()
		defer func() { stopB(); wg.Wait() }()
		wait.Until(t, "an even split", func() bool {
			return len(a.Held()) == n/2 && len(b.Held()) == n/2 && checkDisjoint(t, a, b) == n
		})
		killA()
		<-aDone
		killed := time.Now()
		wait.Until(t, "b to take over", func() bool { return len(b.Held()) == n })
		took := time.Since(killed)
		// a's last renewal ran after the start of its last tick that
		// succeeded, so its leases ran at least the TTL past that start: a
		// takeover seen before then took leases still held. The bound
		// comes from this run's own ticks, however slow; how soon after
		// expiry the takeover comes is a figure, not a check.
		if expired := time.Unix(0, renewed.Load()).Add(ttl); time.Now().Before(expired) {
			t.Fatalf("b took a's partitions %v after a died, before a's last renewal could expire (%v later)", took, time.Until(expired))
		}
		t.Logf("takeover after %v (TTL %v)", took, ttl)
		stopB()
		wg.Wait()
		leases, err := b.Leases(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, le := range leases {
			if le.Owner != "" {
				t.Fatalf("lease %+v still owned after Run returned", le)
			}
		}
	})
}

func TestLeaserPartitionCountMismatch(t *testing.T) {
	t.Parallel()
	forDialects(t, func(t *testing.T, d dialect.Dialect) {
		db := migrated(t, d)
		newLeaser(t, db, d, "a", 8, time.Second, nil)
		l, err := ordered.NewLeaser(db, d, ordered.LeaserOptions{Owner: "b", PartitionCount: 16})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Run(context.Background()); !errors.Is(err, core.ErrPartitionCountMismatch) {
			t.Fatalf("Run with another partition count = %v, want ErrPartitionCountMismatch", err)
		}
		if _, err := ordered.NewLeaser(db, dialect.SQLite, ordered.LeaserOptions{}); !errors.Is(err, core.ErrUnsupported) {
			t.Fatalf("NewLeaser on SQLite = %v, want ErrUnsupported", err)
		}
		if _, err := ordered.NewLeaser(db, d, ordered.LeaserOptions{LeaseTTL: time.Second, RenewInterval: 2 * time.Second}); !errors.Is(err, core.ErrInvalidOptions) {
			t.Fatalf("RenewInterval above LeaseTTL: %v, want ErrInvalidOptions", err)
		}
	})
}

// A schema-qualified outbox gets its lease tables in its schema, and its
// own relay group.
func TestLeaserAndStoreInASchema(t *testing.T) {
	db := testenv.OpenPostgres(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA app"); err != nil {
		t.Fatal(err)
	}
	opts := dialect.MigrateOptions{Table: "app.events", SkipInbox: true, Logger: testLogger(t)}
	if err := dialect.Migrate(ctx, db, dialect.Postgres, opts); err != nil {
		t.Fatal(err)
	}
	l, err := ordered.NewLeaser(db, dialect.Postgres, ordered.LeaserOptions{Table: "app.events", PartitionCount: 4, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Init(ctx); err != nil {
		t.Fatal(err)
	}
	tick(t, l)
	if len(l.Held()) != 4 {
		t.Fatalf("held %v, want 4 partitions", l.Held())
	}
	var group string
	if err := db.QueryRowContext(ctx, "SELECT DISTINCT relay_group FROM app.txoutbox_leases").Scan(&group); err != nil {
		t.Fatal(err)
	}
	if group != "app.events" {
		t.Fatalf("relay group %q, want app.events", group)
	}
	s, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Dialect: dialect.Postgres, Table: "app.events"})
	if err != nil {
		t.Fatal(err)
	}
	c := claim(t, s, core.ClaimRequest{Limit: 10, Ordered: &core.OrderedClaim{Partitions: l.Held(), PartitionCount: 4}})
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
