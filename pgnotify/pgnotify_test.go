package pgnotify_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"

	pgxoutbox "github.com/txoutbox/txoutbox/adapters/pgx"
	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/logbuf"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/pgnotify"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// wakes is a core.Notifier that counts and signals its calls.
type wakes struct {
	mu sync.Mutex
	n  int
	ch chan struct{}
}

func newWakes() *wakes { return &wakes{ch: make(chan struct{}, 1000)} }

func (w *wakes) Notify() {
	w.mu.Lock()
	w.n++
	w.mu.Unlock()
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

func (w *wakes) drain() {
	for {
		select {
		case <-w.ch:
		default:
			return
		}
	}
}

// wait waits for the next call; the deadline only guards against a hang.
func (w *wakes) wait(t *testing.T, what string) {
	t.Helper()
	select {
	case <-w.ch:
	case <-time.After(wait.Stall):
		t.Fatalf("no wake-up in %v: %s", wait.Stall, what)
	}
}

func run(t *testing.T, fn func(ctx context.Context) error) {
	t.Helper()
	runB(t, fn)
}

func runB(t testing.TB, fn func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v", err)
		}
	})
}

func notifyRaw(t *testing.T, dsn, channel string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_notify($1, 'x')", channel); err != nil {
		t.Fatal(err)
	}
}

func terminate(t *testing.T, dsn string, pid uint32) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int32(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("terminate backend %d: %v %v", pid, ok, err)
	}
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	long := string(make([]byte, 64))
	if _, err := pgnotify.NewListener("postgres://x", nil, pgnotify.ListenerOptions{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("nil target: %v", err)
	}
	if _, err := pgnotify.NewListener("postgres://x", newWakes(), pgnotify.ListenerOptions{Channel: long}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("long channel: %v", err)
	}
	if _, err := pgnotify.NewListener("not a dsn ://", newWakes(), pgnotify.ListenerOptions{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("bad dsn: %v", err)
	}
	if _, err := pgnotify.NewNotifier("postgres://x", pgnotify.NotifierOptions{Debounce: -1}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("negative debounce: %v", err)
	}
	if _, err := pgnotify.NewNotifier("postgres://x", pgnotify.NotifierOptions{MinBackoff: time.Second, MaxBackoff: time.Millisecond}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("max below min backoff: %v", err)
	}
	if _, err := pgnotify.NewNotifier("postgres://x", pgnotify.NotifierOptions{MaxDebounce: -1}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("negative max debounce: %v", err)
	}
	if _, err := pgnotify.NewNotifier("postgres://x", pgnotify.NotifierOptions{Debounce: time.Second, MaxDebounce: time.Millisecond}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("max debounce below debounce: %v", err)
	}
	n, err := pgnotify.NewNotifier("postgres://x", pgnotify.NotifierOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if o := n.Options(); n.Channel() != pgnotify.DefaultChannel || o.Debounce != pgnotify.DefaultDebounce || o.MaxDebounce != pgnotify.DefaultMaxDebounce {
		t.Errorf("defaults: channel %q debounce %v max %v", n.Channel(), o.Debounce, o.MaxDebounce)
	}
	if _, err := pgnotify.NewListenerConfig(nil, newWakes(), pgnotify.ListenerOptions{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("nil listener config: %v", err)
	}
	if _, err := pgnotify.NewNotifierConfig(nil, pgnotify.NotifierOptions{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("nil notifier config: %v", err)
	}
	// A pool's configuration is the caller's: the Notifier and Listener
	// name their own copies.
	cfg, err := pgx.ParseConfig("postgres://x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgnotify.NewNotifierConfig(cfg, pgnotify.NotifierOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pgnotify.NewListenerConfig(cfg, newWakes(), pgnotify.ListenerOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(cfg.RuntimeParams) != 0 {
		t.Errorf("the caller's configuration was changed: %v", cfg.RuntimeParams)
	}
	// A long Debounce alone raises the maximum with it.
	if n, err := pgnotify.NewNotifier("postgres://x", pgnotify.NotifierOptions{Debounce: time.Second}); err != nil || n.Options().MaxDebounce != time.Second {
		t.Errorf("Debounce 1s: max %v, %v", n.Options().MaxDebounce, err)
	}
}

// Under a steady stream of requests the window doubles up to MaxDebounce,
// so the NOTIFY rate falls well below 1/Debounce; the stream still gets
// its notifications.
func TestNotifierWidensItsWindowUnderLoad(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	w := newWakes()
	l, err := pgnotify.NewListener(dsn, w, pgnotify.ListenerOptions{Channel: "steady", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, l.Run)
	<-l.Ready()
	n, err := pgnotify.NewNotifier(dsn, pgnotify.NotifierOptions{Channel: "steady", Debounce: 5 * time.Millisecond, MaxDebounce: 80 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, n.Run)
	// The notifier connects at its first request: connected first, so that
	// the stream below meets a notifier that sends (on a loaded machine
	// the connection took longer than the whole stream, which then
	// reached the server as one NOTIFY).
	n.Notify()
	wait.Until(t, "the first NOTIFY", func() bool { return n.Stats().Sent == 1 && l.Stats().Notifications == 1 })
	// 500 requests a millisecond apart: at a fixed 5 ms window that is
	// about 100 NOTIFYs; doubling to 80 ms makes it about 11.
	for range 500 {
		n.Notify()
		time.Sleep(time.Millisecond)
	}
	wait.Until(t, "the last window's NOTIFY", func() bool { return l.Stats().Notifications == n.Stats().Sent })
	if s := n.Stats(); s.Sent-1 < 2 || s.Sent-1 > 30 || s.Errors != 0 {
		t.Errorf("notifier stats %+v (the first NOTIFY before the stream included), want 2 to 30 sent for a steady stream", s)
	}
}

func TestListenerWakesTargetAndReconnects(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	w := newWakes()
	l, err := pgnotify.NewListener(dsn, w, pgnotify.ListenerOptions{Channel: "Orders Events", MinBackoff: 10 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, l.Run)
	<-l.Ready()
	w.wait(t, "the wake-up after connecting")
	w.drain()

	notifyRaw(t, dsn, "Orders Events")
	w.wait(t, "a NOTIFY on a channel whose name needs quoting")
	wait.Until(t, "notification counted", func() bool { return l.Stats().Notifications == 1 })

	notifyRaw(t, dsn, "other_channel")
	notifyRaw(t, dsn, "Orders Events")
	w.wait(t, "the second NOTIFY")
	wait.Until(t, "only our channel counted", func() bool { return l.Stats().Notifications == 2 })

	// A dropped connection: the listener reconnects and wakes the target,
	// since it may have missed notifications meanwhile.
	if err := l.Run(context.Background()); !errors.Is(err, pgnotify.ErrAlreadyRunning) {
		t.Errorf("second Run: %v", err)
	}
	w.drain()
	terminate(t, dsn, l.BackendPID())
	wait.Until(t, "reconnected", func() bool { return l.Stats().Connects == 2 })
	w.wait(t, "the wake-up after reconnecting")
	if s := l.Stats(); s.Errors < 1 {
		t.Errorf("stats after a lost connection: %+v", s)
	}
	w.drain()
	notifyRaw(t, dsn, "Orders Events")
	w.wait(t, "a NOTIFY after the reconnect")
}

func TestNotifierCoalescesABurst(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	w := newWakes()
	l, err := pgnotify.NewListener(dsn, w, pgnotify.ListenerOptions{Channel: "burst", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, l.Run)
	<-l.Ready()

	// A window of an hour: the first request is sent at once, the other 999
	// of the burst wait for the window to end, so exactly one NOTIFY goes
	// out however fast the loop runs.
	n, err := pgnotify.NewNotifier(dsn, pgnotify.NotifierOptions{Channel: "burst", Debounce: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, n.Run)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 250 {
				n.Notify()
			}
		}()
	}
	wg.Wait()
	wait.Until(t, "one NOTIFY sent", func() bool { return n.Stats().Sent == 1 })
	wait.Until(t, "one NOTIFY received", func() bool { return l.Stats().Notifications == 1 })
	if s := n.Stats(); s.Requested != 1000 || s.Sent != 1 || s.Errors != 0 {
		t.Errorf("notifier stats %+v, want 1000 requested, 1 sent", s)
	}
	if l.Stats().Notifications != 1 {
		t.Errorf("listener got %d notifications, want 1", l.Stats().Notifications)
	}
}

func TestNotifierSendsEveryWindowAndReconnects(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	w := newWakes()
	l, err := pgnotify.NewListener(dsn, w, pgnotify.ListenerOptions{Channel: "reconnect", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, l.Run)
	<-l.Ready()
	n, err := pgnotify.NewNotifier(dsn, pgnotify.NotifierOptions{Channel: "reconnect", MinBackoff: 10 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, n.Run)

	// Requests spaced by waiting for each to arrive are never coalesced.
	for i := 1; i <= 3; i++ {
		n.Notify()
		wait.Until(t, "notification arrived", func() bool { return l.Stats().Notifications == int64(i) })
	}
	// The notifier counts a NOTIFY once the server answered it, which can
	// come after the listener already received it.
	wait.Until(t, "the notifier counted its third NOTIFY", func() bool { return n.Stats().Sent >= 3 })
	if s := n.Stats(); s.Sent != 3 {
		t.Errorf("sent %d, want 3", s.Sent)
	}

	// Kill the notifier's connection: the next request fails (one wake-up
	// lost, the poll covers it), the one after reconnects and arrives.
	terminate(t, dsn, n.BackendPID())
	before := l.Stats().Notifications
	wait.Until(t, "a notification after the connection was killed", func() bool {
		n.Notify()
		time.Sleep(20 * time.Millisecond)
		return l.Stats().Notifications > before
	})
	if s := n.Stats(); s.Errors < 1 {
		t.Errorf("stats after a killed connection: %+v", s)
	}
}

// TestRelayWokenAcrossConnections is the whole path on the real database: a
// producer's Enqueue asks the Notifier, the Notifier's NOTIFY reaches the
// Listener, the Listener wakes a relay that would otherwise not poll for an
// hour, and the relay publishes the event. The producer and the relay use
// separate pools, as separate processes do, so that no in-process wake-up
// can stand in for the notification. It runs on database/sql with DSNs and
// on pgx pools with their configurations.
func TestRelayWokenAcrossConnections(t *testing.T) {
	t.Parallel()
	type side struct {
		enqueue func(ctx context.Context, evs []core.Event) error
		store   core.Store
	}
	t.Run("database/sql", func(t *testing.T) {
		t.Parallel()
		dsn := testenv.PostgresDSN(t)
		open := func() *sqlx.DB {
			db, err := sqlx.Open("pgx", dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return db
		}
		producerDB, relayDB := open(), open()
		if err := dialect.Migrate(t.Context(), producerDB.DB, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: quiet}); err != nil {
			t.Fatal(err)
		}
		n, err := pgnotify.NewNotifier(dsn, pgnotify.NotifierOptions{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		producer, err := sqlxoutbox.New(producerDB, sqlxoutbox.Options{Notifier: n, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		relayStore, err := sqlxoutbox.New(relayDB, sqlxoutbox.Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		relayWokenAcrossConnections(t, n, func(relay *core.Relay) (*pgnotify.Listener, error) {
			return pgnotify.NewListener(dsn, relay, pgnotify.ListenerOptions{Logger: quiet})
		}, relayStore, func(ctx context.Context, evs []core.Event) error {
			tx, err := producerDB.BeginTxx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if err := producer.Enqueue(ctx, tx, evs...); err != nil {
				return err
			}
			return tx.Commit()
		})
	})
	t.Run("pgx", func(t *testing.T) {
		t.Parallel()
		dsn := testenv.PostgresDSN(t)
		producerPool, relayPool := testenv.OpenPgxPool(t, dsn), testenv.OpenPgxPool(t, dsn)
		if err := pgxoutbox.Migrate(t.Context(), producerPool, dialect.MigrateOptions{SkipInbox: true, Logger: quiet}); err != nil {
			t.Fatal(err)
		}
		n, err := pgnotify.NewNotifierConfig(producerPool.Config().ConnConfig, pgnotify.NotifierOptions{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		producer, err := pgxoutbox.New(producerPool, pgxoutbox.Options{Notifier: n, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		relayStore, err := pgxoutbox.New(relayPool, pgxoutbox.Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		relayWokenAcrossConnections(t, n, func(relay *core.Relay) (*pgnotify.Listener, error) {
			return pgnotify.NewListenerConfig(relayPool.Config().ConnConfig, relay, pgnotify.ListenerOptions{Logger: quiet})
		}, relayStore, func(ctx context.Context, evs []core.Event) error {
			return pgx.BeginFunc(ctx, producerPool, func(tx pgx.Tx) error { return producer.Enqueue(ctx, tx, evs...) })
		})
	})
}

func relayWokenAcrossConnections(t *testing.T, n *pgnotify.Notifier, newListener func(*core.Relay) (*pgnotify.Listener, error),
	relayStore core.Store, enqueue func(ctx context.Context, evs []core.Event) error) {
	t.Helper()
	ctx := t.Context()
	run(t, n.Run)
	published := make(chan core.Event, 10)
	pub := core.PublisherFunc(func(_ context.Context, evs []core.Event) error {
		for _, ev := range evs {
			published <- ev
		}
		return nil
	})
	relay, err := core.NewRelay(relayStore, pub, core.RelayOptions{PollInterval: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	l, err := newListener(relay)
	if err != nil {
		t.Fatal(err)
	}
	run(t, l.Run)
	<-l.Ready()
	run(t, relay.Run)
	// After each publish the relay looks again for a quarter of a second
	// (its wake grace) and then waits for its hour-long poll; each event is
	// enqueued after that, so it can only be published because a
	// notification woke the relay.
	for i := range 3 {
		ev, err := core.NewEvent("order", "o-1", "order.created", map[string]int{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		evs := []core.Event{ev}
		time.Sleep(time.Second)
		if err := enqueue(ctx, evs); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-published:
			if got.ID != evs[0].ID {
				t.Fatalf("published %s, want %s", got.ID, evs[0].ID)
			}
		case <-time.After(wait.Stall):
			t.Fatalf("event %d not published: no wake-up reached the relay (notifier %+v, listener %+v)", i, n.Stats(), l.Stats())
		}
	}
	if s := l.Stats(); s.Notifications < 1 {
		t.Errorf("listener stats %+v", s)
	}
}

// A Listener whose connection goes through PgBouncer in transaction
// pooling mode stops at once with ErrPooledListen and one error line with
// the fix, instead of waiting for notifications that cannot come (with or
// without pgx's statement cache); the same Listener on a direct
// connection listens.
func TestListenerRefusesATransactionPooler(t *testing.T) {
	t.Parallel()
	for _, params := range [][]string{nil, {"default_query_exec_mode", "exec"}} {
		bouncer, direct := testenv.PgBouncerDSN(t, params...)
		var out logbuf.Buffer
		l, err := pgnotify.NewListener(bouncer, newWakes(), pgnotify.ListenerOptions{Logger: slog.New(slog.NewTextHandler(&out, nil))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		err = l.Run(ctx)
		cancel()
		if !errors.Is(err, pgnotify.ErrPooledListen) {
			t.Fatalf("%v: Run through PgBouncer = %v, want ErrPooledListen:\n%s", params, err, out.String())
		}
		if n := strings.Count(out.String(), "level=ERROR"); n != 1 || !strings.Contains(out.String(), "directly") {
			t.Errorf("%v: %d error lines, want one naming the fix:\n%s", params, n, out.String())
		}
		w := newWakes()
		l, err = pgnotify.NewListener(direct, w, pgnotify.ListenerOptions{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		run(t, l.Run)
		<-l.Ready()
		w.wait(t, "the wake-up after connecting directly")
	}
}
