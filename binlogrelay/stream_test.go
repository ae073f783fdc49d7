package binlogrelay_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/binlogrelay"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/logmode"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// A relay stopped before the broker took anything stores nothing: the
// next relay delivers every event (at least once, never a gap), and none
// went to the table.
func TestStoppedRelayRedelivers(t *testing.T) {
	t.Parallel()
	l := fixtures.NewBinLog(t, "", fixtures.Options{SkipInbox: true})
	evs := events(t, 200, 10)
	enqueue(t, l, evs, 20)
	block := core.PublisherFunc(func(ctx context.Context, _ []core.Event) error {
		<-ctx.Done()
		return ctx.Err()
	})
	r1 := newRelay(t, l, block, binlogrelay.Options{})
	stop := run(t, r1)
	wait.Until(t, "the first relay to stream", r1.Streaming)
	time.Sleep(300 * time.Millisecond)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	rec := outboxtest.NewRecorder()
	run(t, newRelay(t, l, rec, binlogrelay.Options{}))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(ctx, len(evs)); err != nil {
		t.Fatal(err)
	}
	if n := count(t, l.DB.DB, "SELECT COUNT(*) FROM "+l.Table.String()+" WHERE published_at IS NULL"); n != 0 {
		t.Errorf("%d rows in the retry path: the stopped relay handed events to the table", n)
	}
}

// A graceful stop stores the position at once, and the next relay resumes
// there across a binlog rotation (FLUSH BINARY LOGS): every event once, in
// commit order, none sent again.
func TestRotationAndGracefulRestart(t *testing.T) {
	t.Parallel()
	l := fixtures.NewBinLog(t, "", fixtures.Options{SkipInbox: true})
	rec := outboxtest.NewRecorder()
	evs := events(t, 300, 5)
	stop := run(t, newRelay(t, l, rec, binlogrelay.Options{ConfirmInterval: time.Hour}))
	enqueue(t, l, evs[:50], 10)
	if _, err := l.DB.DB.ExecContext(t.Context(), "FLUSH BINARY LOGS"); err != nil {
		t.Fatal(err)
	}
	enqueue(t, l, evs[50:100], 10)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(ctx, 100); err != nil {
		t.Fatal(err)
	}
	// ConfirmInterval is an hour: only the stop stores the position.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	enqueue(t, l, evs[100:200], 10)
	if _, err := l.DB.DB.ExecContext(t.Context(), "FLUSH BINARY LOGS"); err != nil {
		t.Fatal(err)
	}
	run(t, newRelay(t, l, rec, binlogrelay.Options{}))
	enqueue(t, l, evs[200:], 10)
	if err := rec.WaitDistinct(ctx, len(evs)); err != nil {
		t.Fatal(err)
	}
	if err := l.Settled(ctx); err != nil {
		t.Fatal(err)
	}
	if d := rec.Duplicates(); d != 0 {
		t.Errorf("%d events sent again after a graceful restart", d)
	}
	for i, got := range rec.Events() {
		if got.ID != evs[i].ID {
			t.Fatalf("delivery %d is not event %d: commit order broken", i, i)
		}
	}
}

// A stop that comes while the broker takes the last batch, after it took
// it: the broker's answer stands, the position stored at stop covers the
// batch, and the next relay sends none of it again.
func TestStopDuringAnAcceptedPublish(t *testing.T) {
	t.Parallel()
	l := fixtures.NewBinLog(t, "", fixtures.Options{SkipInbox: true})
	relay := func(o binlogrelay.Options) func(core.Publisher) fixtures.Runner {
		return func(pub core.Publisher) fixtures.Runner { return newRelay(t, l, pub, o) }
	}
	fixtures.StopDuringAnAcceptedPublish(t, events(t, 60, 3), relay(binlogrelay.Options{ConfirmInterval: time.Hour}), relay(binlogrelay.Options{}),
		func(evs []core.Event) { enqueue(t, l, evs, 10) }, l.Settled)
}

// Two relays on one stream: one streams, the other stands by, takes over
// when the first's server connection is killed, and again when the first
// stops for good.
func TestStandbyTakesOver(t *testing.T) {
	t.Parallel()
	l := fixtures.NewBinLog(t, "", fixtures.Options{SkipInbox: true})
	rec := outboxtest.NewRecorder()
	a, b := newRelay(t, l, rec, binlogrelay.Options{}), newRelay(t, l, rec, binlogrelay.Options{})
	stopA := run(t, a)
	wait.Until(t, "a to stream", a.Streaming)
	stopB := run(t, b)
	time.Sleep(1500 * time.Millisecond)
	if b.Streaming() {
		t.Fatal("both relays stream one outbox")
	}
	evs := events(t, 300, 10)
	enqueue(t, l, evs[:100], 10)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(ctx, 100); err != nil {
		t.Fatal(err)
	}
	st, err := binlogrelay.ReadStatus(ctx, l.DB.DB, l.Names)
	if err != nil || !st.Streaming {
		t.Fatalf("status while a streams: %+v, %v", st, err)
	}
	// The lock's connection is killed: a loses the stream, and one of
	// the two streams again.
	if _, err := l.DB.DB.ExecContext(ctx, "KILL CONNECTION ?", st.StreamingConnection); err != nil {
		t.Fatal(err)
	}
	enqueue(t, l, evs[100:200], 10)
	if err := rec.WaitDistinct(ctx, 200); err != nil {
		t.Fatal(err)
	}
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
	if streams := a.Counters().Streams + b.Counters().Streams; streams < 3 {
		t.Errorf("%d stream starts over both relays, want at least 3", streams)
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

// Ordered mode: a failed event and the later events of its aggregate go to
// the table's retry path and are published from there in order once the
// broker takes them; other aggregates flow on.
func TestOrderedFailureHoldsItsAggregate(t *testing.T) {
	t.Parallel()
	l := fixtures.NewBinLog(t, "", fixtures.Options{SkipInbox: true})
	rec := outboxtest.NewRecorder()
	pub := &flaky{inner: rec, down: map[string]bool{"agg-0": true}}
	r := newRelay(t, l, pub, binlogrelay.Options{Options: logmode.Options{HoldOnBrokerDown: -1, Relay: core.RelayOptions{
		Ordering:     core.OrderingOn,
		PollInterval: 50 * time.Millisecond,
		Retry:        core.RetryPolicy{InitialBackoff: 700 * time.Millisecond, MaxBackoff: 700 * time.Millisecond, MaxAttempts: 1000},
	}}})
	run(t, r)
	evs := events(t, 300, 4) // agg-0 is every fourth
	enqueue(t, l, evs[:100], 5)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(ctx, 75); err != nil {
		t.Fatal(err)
	}
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
	failed := count(t, l.DB.DB, "SELECT COUNT(*) FROM "+l.Table.String()+" WHERE published_at IS NULL AND attempt_count > 0 AND last_error IS NOT NULL")
	if failed == 0 {
		t.Error("no row of the retry path carries its attempt and error")
	}
	pub.heal()
	enqueue(t, l, evs[200:], 5)
	if err := rec.WaitDistinct(ctx, len(evs)); err != nil {
		t.Fatal(err)
	}
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
	wait.Until(t, "the retry path to drain", func() bool {
		return count(t, l.DB.DB, "SELECT COUNT(*) FROM "+l.Table.String()+" WHERE published_at IS NULL") == 0
	})
}

// Producers keep their code: ExecWithEvents, Enqueue with SkipReadBack and
// a hand-written INSERT reach the broker through the stream; an INSERT
// that sets published_at NULL itself goes to the table relay, once.
func TestEveryWritePath(t *testing.T) {
	t.Parallel()
	l := fixtures.NewBinLog(t, "", fixtures.Options{SkipInbox: true})
	rec := outboxtest.NewRecorder()
	r := newRelay(t, l, rec, binlogrelay.Options{Options: logmode.Options{Relay: core.RelayOptions{PollInterval: 50 * time.Millisecond}}})
	run(t, r)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	evs := events(t, 4, 4)
	tx, err := l.X.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Box.ExecWithEvents(ctx, tx, "INSERT INTO orders (id, events) VALUES (?, 1)", []any{1}, evs[0]); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	plain, err := sqlxoutbox.NewDB(l.X.DB, sqlxoutbox.Options{Table: l.Table.String(), SkipReadBack: true})
	if err != nil {
		t.Fatal(err)
	}
	tx, err = l.X.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Enqueue(ctx, tx, evs[1]); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	ins := "INSERT INTO " + l.Table.String() + " (event_id, aggregate_type, aggregate_id, event_type, payload) VALUES (?, ?, ?, ?, ?)"
	if _, err := l.DB.DB.ExecContext(ctx, ins, evs[2].ID, evs[2].AggregateType, evs[2].AggregateID, evs[2].EventType, string(evs[2].Payload)); err != nil {
		t.Fatal(err)
	}
	if _, err := l.DB.DB.ExecContext(ctx, "INSERT INTO "+l.Table.String()+" (event_id, aggregate_type, aggregate_id, event_type, payload, published_at) VALUES (?, ?, ?, ?, ?, NULL)",
		evs[3].ID, evs[3].AggregateType, evs[3].AggregateID, evs[3].EventType, string(evs[3].Payload)); err != nil {
		t.Fatal(err)
	}
	if err := rec.WaitDistinct(ctx, len(evs)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if d := rec.Duplicates(); d != 0 {
		t.Errorf("%d duplicates: a row went both ways", d)
	}
	if c := r.Counters(); c.Published != 3 {
		t.Errorf("the stream published %d events, want 3 (the explicit NULL is the table relay's)", c.Published)
	}
}

// Setup twice is a no-op; the status tells the position, the server's, and
// that the files are held; Teardown waits for a relay to reach the switch,
// hands producers back to the table at once, and with Force hands what no
// relay reached to the table's retry path.
func TestSetupStatusTeardown(t *testing.T) {
	t.Parallel()
	l := fixtures.NewBinLog(t, "", fixtures.Options{SkipInbox: true})
	ctx := t.Context()
	if err := binlogrelay.Setup(ctx, l.DSN, l.Names); err != nil {
		t.Fatal(err)
	}
	st, err := binlogrelay.ReadStatus(ctx, l.DB.DB, l.Names)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Exists || !st.DefaultSet || !st.FilesHeld || st.Streaming || st.Position.File == "" || st.Server.File == "" {
		t.Fatalf("status after setup: %+v", st)
	}
	evs := events(t, 10, 2)
	enqueue(t, l, evs, 10)
	st, err = binlogrelay.ReadStatus(ctx, l.DB.DB, l.Names)
	if err != nil || st.BehindBytes <= 0 {
		t.Fatalf("status with events unread: %+v, %v", st, err)
	}
	err = binlogrelay.Teardown(ctx, l.DSN, l.Names, binlogrelay.TeardownOptions{Wait: 300 * time.Millisecond})
	if !errors.Is(err, binlogrelay.ErrNotDrained) {
		t.Fatalf("Teardown with no relay: %v, want ErrNotDrained", err)
	}
	// Producers are back on the table: the row is born unpublished.
	after := events(t, 1, 1)
	enqueue(t, l, after, 1)
	if n := count(t, l.DB.DB, "SELECT COUNT(*) FROM "+l.Table.String()+" WHERE event_id = ? AND published_at IS NULL", after[0].ID); n != 1 {
		t.Fatal("a row written after Teardown's switch is not the table relay's")
	}
	// Force: what the stream never sent goes to the retry path.
	if err := binlogrelay.Teardown(ctx, l.DSN, l.Names, binlogrelay.TeardownOptions{Wait: 300 * time.Millisecond, Force: true}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, l.DB.DB, "SELECT COUNT(*) FROM "+l.Table.String()+" WHERE published_at IS NULL"); n != len(evs)+1 {
		t.Fatalf("%d rows for the table relay after a forced teardown, want %d", n, len(evs)+1)
	}
	st, err = binlogrelay.ReadStatus(ctx, l.DB.DB, l.Names)
	if err != nil || st.Exists || st.DefaultSet {
		t.Errorf("status after teardown: %+v, %v", st, err)
	}
}

// The binlog the stream needs is purged while no relay runs: the relay
// stops with ErrBinlogPurged and says what to do; Recover hands the events
// to the table's retry path, and a relay delivers every one.
func TestPurgedBinlogRecover(t *testing.T) {
	t.Parallel()
	srv := testenv.StartMariaDB(t) // PURGE would take other tests' files
	l := fixtures.NewBinLog(t, srv.NewDatabase(t), fixtures.Options{SkipInbox: true})
	evs := events(t, 50, 5)
	enqueue(t, l, evs, 10)
	for _, q := range []string{"FLUSH BINARY LOGS", "FLUSH BINARY LOGS"} {
		if _, err := l.DB.DB.ExecContext(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	var file string
	var pos int64
	var a, b any
	if err := l.DB.DB.QueryRowContext(t.Context(), "SHOW MASTER STATUS").Scan(&file, &pos, &a, &b); err != nil {
		t.Fatal(err)
	}
	// The server keeps a file until InnoDB's checkpoint of it is written:
	// purge until it is gone.
	var st binlogrelay.Status
	wait.Until(t, "the purge of the stream's binlog file", func() bool {
		if _, err := l.DB.DB.ExecContext(t.Context(), "PURGE BINARY LOGS TO '"+file+"'"); err != nil {
			t.Fatal(err)
		}
		var err error
		if st, err = binlogrelay.ReadStatus(t.Context(), l.DB.DB, l.Names); err != nil {
			t.Fatal(err)
		}
		return !st.FilesHeld
	})
	if !st.Exists || st.BehindBytes < 0 {
		t.Fatalf("status after the purge: %+v", st)
	}
	rec := outboxtest.NewRecorder()
	r := newRelay(t, l, rec, binlogrelay.Options{Options: logmode.Options{Relay: core.RelayOptions{PollInterval: 50 * time.Millisecond}}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := r.Run(ctx); !errors.Is(err, binlogrelay.ErrBinlogPurged) || !binlogrelay.BinlogPurged(r) {
		t.Fatalf("Run after the purge: %v, want ErrBinlogPurged", err)
	}
	if rec.Distinct() != 0 {
		t.Fatal("events published from a stream that cannot resume")
	}
	n, err := binlogrelay.Recover(ctx, l.DSN, l.Names)
	if err != nil || n != int64(len(evs)) {
		t.Fatalf("Recover handed %d rows, %v; want %d", n, err, len(evs))
	}
	more := events(t, 20, 5)
	run(t, newRelay(t, l, rec, binlogrelay.Options{Options: logmode.Options{Relay: core.RelayOptions{PollInterval: 50 * time.Millisecond}}}))
	enqueue(t, l, more, 5)
	if err := rec.WaitDistinct(ctx, len(evs)+len(more)); err != nil {
		t.Fatal(err)
	}
}

// Bad names and options are refused before anything is written.
func TestInvalidNames(t *testing.T) {
	t.Parallel()
	for _, n := range []binlogrelay.Names{{Name: "Bad-Name"}, {Table: "a b"}} {
		if err := binlogrelay.Setup(t.Context(), "u:p@tcp(127.0.0.1:1)/x", n); !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("Setup(%+v) = %v, want ErrInvalidOptions", n, err)
		}
	}
	if _, err := binlogrelay.New(nil, nil, binlogrelay.Options{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("New without store: %v", err)
	}
}

// A broker that takes none of a batch for less than HoldOnBrokerDown: the
// stream retries the batch instead of handing it to the table, so nothing
// is written to the table and every event arrives once the broker is
// back, in commit order.
func TestShortBrokerOutageIsHeldNotTabled(t *testing.T) {
	t.Parallel()
	l := fixtures.NewBinLog(t, "", fixtures.Options{SkipInbox: true})
	rec := outboxtest.NewRecorder()
	var mu sync.Mutex
	down := true
	pub := core.PublisherFunc(func(ctx context.Context, evs []core.Event) error {
		mu.Lock()
		d := down
		mu.Unlock()
		if d {
			return errors.New("connection refused")
		}
		return rec.Publish(ctx, evs)
	})
	r := newRelay(t, l, pub, binlogrelay.Options{Options: logmode.Options{HoldOnBrokerDown: 10 * time.Second}})
	run(t, r)
	evs := events(t, 100, 5)
	enqueue(t, l, evs, 10)
	wait.Until(t, "the stream to find the broker down", func() bool { return r.Health().BrokerDown })
	time.Sleep(time.Second)
	mu.Lock()
	down = false
	mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(ctx, len(evs)); err != nil {
		t.Fatal(err)
	}
	if c := r.Counters(); c.TableWrites != 0 || c.Failed != 0 {
		t.Errorf("counters %+v: a short outage wrote to the table", c)
	}
	for i, got := range rec.Events() {
		if got.ID != evs[i].ID {
			t.Fatalf("delivery %d is not event %d: commit order broken by the hold", i, i)
		}
	}
	wait.Until(t, "the relay to report the broker back", func() bool { return !r.Health().BrokerDown })
}
