package logrelay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/logbuf"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/logmode"
	"github.com/txoutbox/txoutbox/logrelay"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

var quiet = slog.New(slog.DiscardHandler)

// events makes n events over aggs aggregates.
func events(t *testing.T, n, aggs int) []core.Event {
	t.Helper()
	evs := make([]core.Event, n)
	for i := range evs {
		ev, err := core.NewEvent("order", fmt.Sprintf("agg-%d", i%aggs), "log.test", map[string]int{"i": i})
		if err != nil {
			t.Fatal(err)
		}
		evs[i] = ev
	}
	return evs
}

func enqueue(t *testing.T, l *fixtures.Log, evs []core.Event, per int) {
	t.Helper()
	for i := 0; i < len(evs); i += per {
		if err := l.Enqueue(t.Context(), evs[i:min(i+per, len(evs))], true); err != nil {
			t.Fatal(err)
		}
	}
}

// run runs r until the test ends (or stop is called) and returns stop,
// which waits for Run to return and reports its error.
func run(t *testing.T, r *logmode.Relay) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func newRelay(t *testing.T, l *fixtures.Log, pub core.Publisher, opts core.RelayOptions) *logmode.Relay {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	r, err := l.Relay(pub, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// newFailingRelay is newRelay for the tests of the table's retry path: a
// batch the broker refuses whole goes to the table at once.
func newFailingRelay(t *testing.T, l *fixtures.Log, pub core.Publisher, opts core.RelayOptions) *logmode.Relay {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	r, err := logrelay.New(l.Box, pub, logrelay.Options{ConnString: l.DSN, Names: l.Names, Options: logmode.Options{Relay: opts, HoldOnBrokerDown: -1}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func query[T any](t *testing.T, dsn, sql string, args ...any) T {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var v T
	if err := conn.QueryRow(t.Context(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// On the happy path the relay writes nothing per event: the table never
// holds a row (the server's own tuple counters say so), and the slot's
// confirmed position passes the events.
func TestNoWritePerEvent(t *testing.T) {
	t.Parallel()
	l := fixtures.NewLog(t, fixtures.Options{SkipInbox: true})
	rec := outboxtest.NewRecorder()
	r := newRelay(t, l, rec, core.RelayOptions{})
	run(t, r)
	evs := events(t, 500, 20)
	enqueue(t, l, evs, 10)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(ctx, len(evs)); err != nil {
		t.Fatal(err)
	}
	if err := l.Settled(ctx); err != nil {
		t.Fatal(err)
	}
	if c := r.Counters(); c.TableWrites != 0 || c.Published != int64(len(evs)) || c.Confirms == 0 {
		t.Errorf("counters %+v: want %d published, 0 table writes, some confirms", c, len(evs))
	}
	if n := query[int64](t, l.DSN, "SELECT count(*) FROM "+l.Names.Table); n != 0 {
		t.Errorf("the outbox table holds %d rows in log mode, want 0", n)
	}
	// Enqueue in log mode does not write Seq back: there is no row.
	if evs[0].Seq != 0 {
		t.Errorf("Seq = %d after Enqueue in log mode, want 0", evs[0].Seq)
	}
	// A producer that reads nothing back (one statement, its count of rows
	// checked) writes to the log as well.
	plain, err := sqlxoutbox.NewDB(l.X.DB, sqlxoutbox.Options{Table: l.Names.Table, SkipReadBack: true})
	if err != nil {
		t.Fatal(err)
	}
	more := events(t, 3, 1)
	tx, err := l.X.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Enqueue(ctx, tx, more...); err != nil {
		t.Fatalf("Enqueue with SkipReadBack in log mode: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := rec.WaitDistinct(ctx, len(evs)+len(more)); err != nil {
		t.Fatal(err)
	}
	if n := query[int64](t, l.DSN, "SELECT count(*) FROM "+l.Names.Table); n != 0 {
		t.Errorf("the outbox table holds %d rows after SkipReadBack's Enqueue in log mode, want 0", n)
	}
	for _, got := range rec.Events() {
		if got.Seq == 0 || got.CreatedAt.IsZero() || len(got.Payload) == 0 {
			t.Fatalf("published event lacks its row's fields: %+v", got)
		}
	}
}

// A relay stopped before it confirmed leaves its events in the slot: the
// next relay delivers them again (at least once, never a gap).
func TestStoppedRelayRedelivers(t *testing.T) {
	t.Parallel()
	l := fixtures.NewLog(t, fixtures.Options{SkipInbox: true})
	evs := events(t, 200, 10)
	enqueue(t, l, evs, 20)
	// The first relay's broker never answers: nothing is confirmed.
	block := core.PublisherFunc(func(ctx context.Context, _ []core.Event) error {
		<-ctx.Done()
		return ctx.Err()
	})
	r1 := newRelay(t, l, block, core.RelayOptions{})
	stop := run(t, r1)
	wait.Until(t, "the first relay to stream", r1.Streaming)
	time.Sleep(200 * time.Millisecond)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	rec := outboxtest.NewRecorder()
	run(t, newRelay(t, l, rec, core.RelayOptions{}))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(ctx, len(evs)); err != nil {
		t.Fatal(err)
	}
	if n := query[int64](t, l.DSN, "SELECT count(*) FROM "+l.Names.Table); n != 0 {
		t.Errorf("the table holds %d rows: the stopped relay handed events to the retry path", n)
	}
}

// A stop that comes while the broker takes the last batch, after it took
// it: the broker's answer stands, the position stored at stop covers the
// batch, and the next relay sends none of it again.
func TestStopDuringAnAcceptedPublish(t *testing.T) {
	t.Parallel()
	l := fixtures.NewLog(t, fixtures.Options{SkipInbox: true})
	relay := func(confirm time.Duration) func(core.Publisher) fixtures.Runner {
		return func(pub core.Publisher) fixtures.Runner {
			r, err := logrelay.New(l.Box, pub, logrelay.Options{ConnString: l.DSN, Names: l.Names, ConfirmInterval: confirm, Options: logmode.Options{Relay: core.RelayOptions{Logger: quiet}}})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	fixtures.StopDuringAnAcceptedPublish(t, events(t, 60, 3), relay(time.Hour), relay(0),
		func(evs []core.Event) { enqueue(t, l, evs, 10) }, l.Settled)
}

// Two relays on one slot: one streams, the other stands by and takes over
// when the first stops, and when the first's connection is cut.
func TestStandbyTakesOver(t *testing.T) {
	t.Parallel()
	l := fixtures.NewLog(t, fixtures.Options{SkipInbox: true})
	rec := outboxtest.NewRecorder()
	opts := core.RelayOptions{}
	a, b := newRelay(t, l, rec, opts), newRelay(t, l, rec, opts)
	stopA := run(t, a)
	wait.Until(t, "a to stream", a.Streaming)
	stopB := run(t, b)
	time.Sleep(1500 * time.Millisecond)
	if b.Streaming() {
		t.Fatal("both relays stream one slot")
	}
	evs := events(t, 300, 10)
	enqueue(t, l, evs[:100], 10)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(ctx, 100); err != nil {
		t.Fatal(err)
	}
	// a's walsender is killed: a reconnects or b takes over, and events
	// keep flowing.
	if n := query[int64](t, l.DSN, "SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots WHERE slot_name = $1", l.Names.Slot); n != 1 {
		t.Fatalf("terminated %d walsenders, want 1", n)
	}
	enqueue(t, l, evs[100:200], 10)
	if err := rec.WaitDistinct(ctx, 200); err != nil {
		t.Fatal(err)
	}
	// Now the streaming one stops for good; the other streams within the
	// standby interval.
	wait.Until(t, "one relay to stream", func() bool { return a.Streaming() || b.Streaming() })
	other := b
	if a.Streaming() {
		_ = stopA()
	} else {
		other = a
		_ = stopB()
	}
	start := time.Now()
	wait.Until(t, "the standby to take over", other.Streaming)
	t.Logf("takeover in %s", time.Since(start).Round(time.Millisecond))
	enqueue(t, l, evs[200:], 10)
	if err := rec.WaitDistinct(ctx, len(evs)); err != nil {
		t.Fatal(err)
	}
	if streams := a.Counters().Streams + b.Counters().Streams; streams < 2 {
		t.Errorf("%d stream starts over both relays, want at least 2", streams)
	}
}

// flaky fails every publish of the aggregates in down until healed.
type flaky struct {
	inner core.Publisher
	mu    sync.Mutex
	down  map[string]bool
}

func (f *flaky) Publish(ctx context.Context, evs []core.Event) error {
	f.mu.Lock()
	be := core.NewBatchError(len(evs))
	var ok []core.Event
	var idx []int
	for i, ev := range evs {
		if f.down[ev.AggregateID] {
			be.Errs[i] = errors.New("aggregate refused")
			continue
		}
		ok = append(ok, ev)
		idx = append(idx, i)
	}
	f.mu.Unlock()
	if len(ok) > 0 {
		if err := f.inner.Publish(ctx, ok); err != nil {
			errs := core.EventErrors(err, len(ok))
			for k, i := range idx {
				be.Errs[i] = errs[k]
			}
		}
	}
	return be.ErrOrNil()
}

func (f *flaky) Capabilities() core.PublisherCapabilities {
	return core.PublisherCapabilities{PreservesAggregateOrder: true}
}

func (f *flaky) heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.down)
}

// Ordered mode: when an event of an aggregate fails, it and the later
// events of its aggregate go to the table, and are published from there
// in order once the broker takes them; other aggregates flow on.
func TestOrderedFailureHoldsItsAggregate(t *testing.T) {
	t.Parallel()
	l := fixtures.NewLog(t, fixtures.Options{SkipInbox: true})
	rec := outboxtest.NewRecorder()
	pub := &flaky{inner: rec, down: map[string]bool{"agg-0": true}}
	r := newFailingRelay(t, l, pub, core.RelayOptions{
		Ordering:     core.OrderingOn,
		PollInterval: 50 * time.Millisecond,
		Retry:        core.RetryPolicy{InitialBackoff: 700 * time.Millisecond, MaxBackoff: 700 * time.Millisecond, MaxAttempts: 1000},
	})
	run(t, r)
	if !r.Ordered() {
		t.Fatal("relay is not ordered")
	}
	evs := events(t, 300, 4) // agg-0 is every fourth
	enqueue(t, l, evs[:100], 5)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(ctx, 75); err != nil { // all but agg-0's 25
		t.Fatal(err)
	}
	// agg-0 stays held while it fails, even for events written later.
	enqueue(t, l, evs[100:200], 5)
	if err := rec.WaitDistinct(ctx, 150); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	for _, ev := range rec.Events() {
		if ev.AggregateID == "agg-0" {
			t.Fatalf("agg-0's event %d was published while the aggregate fails", ev.Seq)
		}
	}
	if c := r.Counters(); c.Held == 0 || c.Failed == 0 {
		t.Errorf("counters %+v: want failures and held events", c)
	}
	// Healed, with agg-0's earlier events still in backoff in the table:
	// its new events must queue behind them, not overtake them.
	pub.heal()
	enqueue(t, l, evs[200:], 5)
	if err := rec.WaitDistinct(ctx, len(evs)); err != nil {
		t.Fatal(err)
	}
	// Per aggregate, first deliveries in Seq order.
	last := map[string]int64{}
	seen := map[string]bool{}
	for _, ev := range rec.Events() {
		if seen[ev.ID] {
			continue
		}
		seen[ev.ID] = true
		if ev.Seq < last[ev.AggregateID] {
			t.Fatalf("aggregate %s: event %d after %d", ev.AggregateID, ev.Seq, last[ev.AggregateID])
		}
		last[ev.AggregateID] = ev.Seq
	}
	if err := l.Settled(ctx); err != nil {
		t.Fatal(err)
	}
	if n := query[int64](t, l.DSN, "SELECT count(*) FROM "+l.Names.Table+" WHERE published_at IS NULL"); n != 0 {
		t.Errorf("%d rows still pending in the table", n)
	}
}

// Setup, Status and Teardown: teardown refuses to drop a slot holding
// unconfirmed events, and puts producers back on the table at once.
func TestSetupStatusTeardown(t *testing.T) {
	t.Parallel()
	l := fixtures.NewLog(t, fixtures.Options{SkipInbox: true})
	ctx := t.Context()
	st, err := logrelay.Status(ctx, l.DSN, l.Names)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Exists || !st.TriggerInstalled || st.Active || st.Invalidated {
		t.Fatalf("status after setup: %+v", st)
	}
	// Through a pool of the caller's, the same status (the server's WAL
	// moves on meanwhile: other tests write).
	db := testenv.OpenPostgresDSN(t, l.DSN)
	pooled, err := logrelay.StatusDB(ctx, db, l.Names)
	if err != nil {
		t.Fatal(err)
	}
	same := pooled
	same.RetainedBytes, same.UnconfirmedBytes = st.RetainedBytes, st.UnconfirmedBytes
	if same != st || pooled.RetainedBytes < st.RetainedBytes {
		t.Fatalf("StatusDB = %+v; Status = %+v", pooled, st)
	}
	// Setup again is a no-op.
	if err := logrelay.Setup(ctx, l.DSN, l.Names); err != nil {
		t.Fatal(err)
	}
	evs := events(t, 10, 2)
	enqueue(t, l, evs, 10)
	st, err = logrelay.Status(ctx, l.DSN, l.Names)
	if err != nil {
		t.Fatal(err)
	}
	if st.UnconfirmedBytes <= 0 || st.RetainedBytes <= 0 {
		t.Errorf("status with events in the slot: %+v", st)
	}
	err = logrelay.Teardown(ctx, l.DSN, l.Names, logrelay.TeardownOptions{Wait: 300 * time.Millisecond})
	if !errors.Is(err, logrelay.ErrNotDrained) {
		t.Fatalf("Teardown of a slot with unconfirmed events: %v, want ErrNotDrained", err)
	}
	// Producers are back on the table: the insert returns its row.
	after := events(t, 1, 1)
	enqueue(t, l, after, 1)
	if after[0].Seq == 0 {
		t.Error("Enqueue after teardown got no Seq: the trigger is still there")
	}
	// A relay drains what the slot holds; then teardown completes.
	rec := outboxtest.NewRecorder()
	done := make(chan error, 1)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { done <- newRelay(t, l, rec, core.RelayOptions{}).Run(rctx) }()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(tctx, len(evs)+1); err != nil {
		t.Fatal(err)
	}
	if err := logrelay.Teardown(ctx, l.DSN, l.Names, logrelay.TeardownOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, logrelay.ErrNoSlot) {
			t.Errorf("relay after its slot was dropped: %v, want ErrNoSlot", err)
		}
	case <-time.After(wait.Stall):
		t.Error("the relay still runs long after its slot was dropped")
	}
	if st, err := logrelay.Status(ctx, l.DSN, l.Names); err != nil || st.Exists {
		t.Errorf("status after teardown: %+v, %v", st, err)
	}
	if st, err := logrelay.StatusDB(ctx, db, l.Names); err != nil || st.Exists {
		t.Errorf("StatusDB after teardown: %+v, %v", st, err)
	}
}

// Bad names are refused before anything is written.
func TestInvalidNames(t *testing.T) {
	t.Parallel()
	for _, n := range []logrelay.Names{{Slot: "Bad-Slot"}, {Publication: "x;y"}, {Table: "a b"}} {
		err := logrelay.Setup(t.Context(), "postgres://127.0.0.1:1/none", n)
		if !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("Setup(%+v) = %v, want ErrInvalidOptions", n, err)
		}
	}
	if _, err := logrelay.New(nil, nil, logrelay.Options{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("New without store: %v", err)
	}
}

// A broker that comes back while the stream publishes nothing itself
// (every event it had went to the table, and no new one comes) is reported
// back once the table's relay publishes: the relay's health does not stay
// "broker down".
func TestBrokerBackThroughTheTable(t *testing.T) {
	t.Parallel()
	l := fixtures.NewLog(t, fixtures.Options{SkipInbox: true})
	rec := outboxtest.NewRecorder()
	pub := &flaky{inner: rec, down: map[string]bool{"agg-0": true, "agg-1": true}}
	r := newFailingRelay(t, l, pub, core.RelayOptions{
		Ordering: core.OrderingOn, PollInterval: 50 * time.Millisecond,
		Retry: core.RetryPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, MaxAttempts: 1000},
	})
	evs := events(t, 20, 2)
	enqueue(t, l, evs, 20) // one transaction: the stream's first and only batch
	run(t, r)
	wait.Until(t, "the stream to find the broker down", func() bool { return r.Health().BrokerDown })
	pub.heal()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(ctx, len(evs)); err != nil {
		t.Fatal(err)
	}
	if c := r.Counters(); c.Published != 0 {
		t.Fatalf("the stream published %d events itself; the test wants it to publish none", c.Published)
	}
	wait.Until(t, "the relay to report the broker back", func() bool { return !r.Health().BrokerDown })
}

// PostgreSQL keeps a slot's confirmed position on disk only when the
// slot's restart position moves or at a checkpoint: a crash puts the slot
// back at an older position, and without more the next relay sends again
// everything since (every event, here). The relays record the position
// they confirmed once a second, and a relay after the crash starts from
// the later of the two: nothing confirmed is sent again.
func TestServerCrashSendsNothingConfirmedAgain(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	dsn := cl.NewDatabase(t)
	db := testenv.OpenPostgresDSN(t, dsn)
	s := fixtures.NewSQLX(t, sqlx.NewDb(db, "pgx"), dialect.Postgres, fixtures.Options{SkipInbox: true})
	names := logrelay.Names{Table: s.Table.String(), Slot: "crash", Publication: "crash"}
	if err := logrelay.Setup(t.Context(), dsn, names); err != nil {
		t.Fatal(err)
	}
	rec := outboxtest.NewRecorder()
	r, err := logrelay.New(s.Box, rec, logrelay.Options{ConnString: dsn, Names: names, Options: logmode.Options{Relay: core.RelayOptions{Logger: quiet}}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	evs := events(t, 2000, 10)
	for i := 0; i < len(evs); i += 10 {
		if err := s.Enqueue(t.Context(), evs[i:i+10], true); err != nil {
			t.Fatal(err)
		}
	}
	// The WAL written so far covers every event's commit (each Enqueue
	// returned after its commit was flushed).
	var written string
	if err := db.QueryRowContext(t.Context(), "SELECT pg_current_wal_lsn()::text").Scan(&written); err != nil {
		t.Fatal(err)
	}
	ctx := wait.Context(t, "the events at the broker", 0, func() any { return rec.Distinct() })
	if err := rec.WaitDistinct(ctx, len(evs)); err != nil {
		t.Fatal(err)
	}
	// Confirmed, and recorded: the relays' table holds a position past
	// every event (an idle stream confirms the server's keepalive
	// positions, so it gets there once the last commit is confirmed).
	positions := dialect.Postgres.Quote(dialect.Identifier{Schema: s.Table.Schema, Name: logrelay.PositionsTable})
	var recorded string
	wait.For(t, "the recorded position to pass every event", func() (bool, any) {
		var ok bool
		err := db.QueryRowContext(t.Context(), "SELECT lsn::text, lsn >= $1::pg_lsn FROM "+positions+" WHERE slot = 'crash'", written).Scan(&recorded, &ok)
		return err == nil && ok, recorded
	})
	var slot string
	if err := db.QueryRowContext(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'crash'").Scan(&slot); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	cl.Crash(t)
	cl.Start(t)
	// Drop the pool's connections to the crashed server.
	db.SetMaxIdleConns(0)
	db.SetMaxIdleConns(2)
	var after string
	if err := db.QueryRowContext(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'crash'").Scan(&after); err != nil {
		t.Fatal(err)
	}
	t.Logf("the slot's confirmed position: %s before the crash, %s after", slot, after)
	again := outboxtest.NewRecorder()
	r2, err := logrelay.New(s.Box, again, logrelay.Options{ConnString: dsn, Names: names, Options: logmode.Options{Relay: core.RelayOptions{Logger: quiet}}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, r2)
	wait.Until(t, "the relay after the crash to stream", r2.Streaming)
	more := events(t, 10, 2)
	for i := range more {
		if err := s.Enqueue(t.Context(), more[i:i+1], true); err != nil {
			t.Fatal(err)
		}
	}
	if err := again.WaitDistinct(wait.Context(t, "the events after the crash", 0, func() any { return again.Distinct() }), len(more)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if n := again.Distinct() - len(more); n != 0 {
		t.Errorf("the relay after the crash sent %d of the %d confirmed events again", n, len(evs))
	}
}

// Producers through PgBouncer (transaction pooling), the log relay on a
// direct DSN: every event is streamed. The same relay given the pooler's
// DSN stops with ErrPooler, which names the fix.
func TestBehindPgBouncer(t *testing.T) {
	t.Parallel()
	bouncer, direct := testenv.PgBouncerDSN(t, "default_query_exec_mode", "exec")
	s := fixtures.NewSQLX(t, sqlx.NewDb(testenv.OpenPostgresDSN(t, bouncer), "pgx"), dialect.Postgres, fixtures.Options{Logger: quiet, SkipInbox: true})
	names := logrelay.Names{Table: s.Table.String(), Slot: "t_" + testenv.RandomSuffix(), Publication: "t_" + testenv.RandomSuffix()}
	if err := logrelay.Setup(t.Context(), direct, names); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = logrelay.Teardown(context.Background(), direct, names, logrelay.TeardownOptions{Force: true})
	})

	// PgBouncer names the first startup parameter it refuses, and they are
	// sent in no set order: "replication" or "wal_sender_timeout" (a clean
	// run once saw the relay take the latter for a lost connection and
	// retry for 30 s). Retrying often ends in ErrPooler too, once an order
	// names "replication", so the first refusal must already be the
	// pooler's. 20 tries meet both orders: with the old check, which knew
	// only "replication", the test failed 4 runs of 4.
	for range 20 {
		var log logbuf.Buffer
		viaPooler, err := logrelay.New(s.Box, core.PublisherFunc(func(context.Context, []core.Event) error { return nil }),
			logrelay.Options{ConnString: bouncer, Names: names, Options: logmode.Options{Relay: core.RelayOptions{Logger: slog.New(slog.NewTextHandler(&log, nil))}}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		err = viaPooler.Run(ctx)
		cancel()
		t.Logf("Run through the pooler: %v; its log:\n%s", err, log.String())
		if !errors.Is(err, logrelay.ErrPooler) || !strings.Contains(err.Error(), "direct DSN") {
			t.Fatalf("log relay through PgBouncer: Run = %v, want ErrPooler naming the fix", err)
		}
		if strings.Contains(log.String(), "stream lost") {
			t.Fatal("the relay took the pooler's refusal for a lost connection and retried")
		}
	}

	// The direct DSN with pgx's and pgxpool's own settings in it, which
	// the server would refuse as startup parameters of the replication
	// connection.
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("default_query_exec_mode", "exec")
	q.Set("statement_cache_capacity", "0")
	q.Set("pool_max_conns", "3")
	u.RawQuery = q.Encode()
	rec := outboxtest.NewRecorder()
	r, err := logrelay.New(s.Box, rec, logrelay.Options{ConnString: u.String(), Names: names, Options: logmode.Options{Relay: core.RelayOptions{Logger: quiet}}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, r)
	evs := events(t, 40, 4)
	for i := 0; i < len(evs); i += 10 {
		if err := s.StoreFixture().Enqueue(t.Context(), evs[i:i+10], true); err != nil {
			t.Fatal(err)
		}
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer wcancel()
	if err := rec.WaitDistinct(wctx, len(evs)); err != nil {
		t.Fatalf("%d of %d events streamed: %v", rec.Distinct(), len(evs), err)
	}
}

// Managed PostgreSQL, where nobody is superuser: a role with LOGIN and
// REPLICATION that owns its database and the outbox table sets log mode
// up, produces and streams.
func TestSetupWithoutSuperuser(t *testing.T) {
	t.Parallel()
	admin := testenv.OpenPostgres(t)
	role := "txo_" + testenv.RandomSuffix()
	ctx := t.Context()
	if _, err := admin.ExecContext(ctx, "CREATE ROLE "+role+" LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD 'pw'"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+role+" OWNER "+role); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(testenv.Env(t, "TXOUTBOX_PG_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	u.User, u.Path = url.UserPassword(role, "pw"), "/"+role
	dsn := u.String()
	t.Cleanup(func() {
		names := logrelay.Names{Slot: role, Publication: role}
		_ = logrelay.Teardown(context.Background(), dsn, names, logrelay.TeardownOptions{Force: true})
		_, _ = admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+role+" WITH (FORCE)")
		_, _ = admin.ExecContext(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	db := testenv.OpenPostgresDSN(t, dsn)
	var super bool
	if err := db.QueryRowContext(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil || super {
		t.Fatalf("the role is superuser (%v, %v): the test proves nothing", super, err)
	}
	s := fixtures.NewSQLX(t, sqlx.NewDb(db, "pgx"), dialect.Postgres, fixtures.Options{Logger: quiet, SkipInbox: true})
	names := logrelay.Names{Table: s.Table.String(), Slot: role, Publication: role}
	if err := logrelay.Setup(ctx, dsn, names); err != nil {
		t.Fatalf("Setup as a non-superuser with REPLICATION that owns the table: %v", err)
	}
	rec := outboxtest.NewRecorder()
	r, err := logrelay.New(s.Box, rec, logrelay.Options{ConnString: dsn, Names: names, Options: logmode.Options{Relay: core.RelayOptions{Logger: quiet}}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, r)
	evs := events(t, 20, 4)
	if err := s.StoreFixture().Enqueue(ctx, evs, true); err != nil {
		t.Fatalf("producing as the non-superuser: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(wctx, len(evs)); err != nil {
		t.Fatalf("%d of %d events streamed: %v", rec.Distinct(), len(evs), err)
	}
	if _, err := logrelay.Status(ctx, dsn, names); err != nil {
		t.Errorf("status as the non-superuser: %v", err)
	}
}

// A trigger function installed before scheduled events (its message
// without next_attempt_at) is brought up to date when a relay starts, so
// that a scheduled event is not published at once.
func TestOutdatedTriggerIsUpdated(t *testing.T) {
	t.Parallel()
	l := fixtures.NewLog(t, fixtures.Options{Logger: quiet, SkipInbox: true})
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, l.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var fn, def string
	if err := conn.QueryRow(ctx, "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid) FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"+
		" WHERE t.tgrelid = to_regclass($1) AND t.tgname = $2", l.Names.Table, logrelay.TriggerName).Scan(&fn, &def); err != nil {
		t.Fatal(err)
	}
	old := strings.Replace(def, ",\n\t\t'next_attempt_at', NEW.next_attempt_at)", ")", 1)
	if old == def {
		t.Fatalf("the trigger function does not carry next_attempt_at as expected:\n%s", def)
	}
	if _, err := conn.Exec(ctx, old); err != nil {
		t.Fatal(err)
	}
	now, err := core.NewEvent("order", "1", "order.created", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	later, err := core.NewEvent("order", "2", "order.reminder", map[string]int{"n": 2})
	if err != nil {
		t.Fatal(err)
	}
	later.NotBefore = time.Now().Add(2 * time.Second)
	rec := outboxtest.NewRecorder()
	r, err := l.Relay(rec, core.RelayOptions{Logger: quiet, PollInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// The relay updates the function as its stream starts.
	var src string
	wait.Until(t, "the relay to update the trigger function", func() bool {
		if err := conn.QueryRow(ctx, "SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure($1)", fn).Scan(&src); err != nil {
			t.Fatal(err)
		}
		return strings.Contains(src, "next_attempt_at")
	})
	if !strings.Contains(src, "next_attempt_at") {
		t.Fatalf("the relay left the outdated trigger function as it was:\n%s", src)
	}
	if err := l.StoreFixture().Enqueue(ctx, []core.Event{now, later}, true); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(wctx, 1); err != nil {
		t.Fatal(err)
	}
	if n := rec.Count(now.ID); n != 1 {
		t.Fatalf("the unscheduled event was published %d times", n)
	}
	if n := rec.Count(later.ID); n != 0 {
		t.Errorf("the event scheduled 2s ahead was published at once (%d times)", n)
	}
}

// The position a relay confirms goes to the server as soon as it moves
// (ConfirmInterval 0), so that a killed relay's successor sends little
// again; a long ConfirmInterval leaves it to the status sent every second.
// Twenty transactions 100 ms apart: one confirmation each at once, a few
// in all with the interval.
func TestConfirmInterval(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		interval time.Duration
		ok       func(confirms int64) bool
		want     string
	}{
		{0, func(n int64) bool { return n >= 10 }, "at least 10"},
		{time.Hour, func(n int64) bool { return n <= 6 }, "at most 6"},
	} {
		t.Run(tc.interval.String(), func(t *testing.T) {
			t.Parallel()
			l := fixtures.NewLog(t, fixtures.Options{SkipInbox: true})
			rec := outboxtest.NewRecorder()
			r, err := logrelay.New(l.Box, rec, logrelay.Options{ConnString: l.DSN, Names: l.Names, ConfirmInterval: tc.interval, Options: logmode.Options{Relay: core.RelayOptions{Logger: quiet}}})
			if err != nil {
				t.Fatal(err)
			}
			run(t, r)
			wait.Until(t, "the relay to stream", func() bool { return r.Streaming() })
			evs := events(t, 20, 20)
			start := r.Counters().Confirms
			for i := range evs {
				enqueue(t, l, evs[i:i+1], 1)
				time.Sleep(100 * time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			if err := rec.WaitDistinct(ctx, len(evs)); err != nil {
				t.Fatal(err)
			}
			if n := r.Counters().Confirms - start; !tc.ok(n) {
				t.Errorf("%d positions confirmed for %d transactions 100 ms apart, want %s", n, len(evs), tc.want)
			}
		})
	}
}

// held is a Recorder whose first Publish waits until release is closed.
type held struct {
	*outboxtest.Recorder
	entered, release chan struct{}
	once             sync.Once
}

func (h *held) Publish(ctx context.Context, evs []core.Event) error {
	first := false
	h.once.Do(func() { first = true })
	if first {
		close(h.entered)
		select {
		case <-h.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return h.Recorder.Publish(ctx, evs)
}

// A publisher held up longer than ServerTimeout, with the stream's buffer
// full behind it, does not cost the stream: the relay reads nothing while
// it waits, and that wait is not the server's silence. A fault-matrix
// cell saw a relay drop a live stream ("the server sent nothing for
// 10.555s") while its broker was blackholed.
func TestHeldPublisherKeepsTheStream(t *testing.T) {
	t.Parallel()
	l := fixtures.NewLog(t, fixtures.Options{SkipInbox: true})
	pub := &held{Recorder: outboxtest.NewRecorder(), entered: make(chan struct{}), release: make(chan struct{})}
	r, err := logrelay.New(l.Box, pub, logrelay.Options{ConnString: l.DSN, Names: l.Names, ServerTimeout: time.Second, Options: logmode.Options{Relay: core.RelayOptions{Logger: quiet}}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, r)
	evs := events(t, 301, 7)
	enqueue(t, l, evs[:1], 1)
	select {
	case <-pub.entered:
	case <-time.After(wait.Stall):
		t.Fatalf("the relay published nothing in %v", wait.Stall)
	}
	// More transactions than the stream buffers, one event each.
	enqueue(t, l, evs[1:], 1)
	time.Sleep(3 * time.Second) // the publisher held for three times ServerTimeout
	close(pub.release)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := pub.WaitDistinct(ctx, len(evs)); err != nil {
		t.Fatal(err)
	}
	if c := r.Counters(); c.Streams != 1 {
		t.Errorf("the relay started streaming %d times, want once: it dropped the stream while its publisher was held", c.Streams)
	}
}
