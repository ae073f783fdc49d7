package binlogrelay_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txoutbox/txoutbox/binlogrelay"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// A table-mode relay whose producers write through another handle (another
// process, as far as the relay knows) and which polls once an hour
// publishes within milliseconds when a Watcher wakes it from the binlog.
func TestWatcherWakesTheRelay(t *testing.T) {
	t.Parallel()
	dsn := testenv.MySQLDSN(t)
	relaySide := fixtures.NewSQLXMySQLOn(t, dsn, fixtures.Options{SkipInbox: true})
	producer, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { producer.Close() })
	rec := outboxtest.NewRecorder()
	relay, err := core.NewRelay(relaySide.Box, rec, core.RelayOptions{PollInterval: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, err := binlogrelay.NewWatcher(dsn, relay, binlogrelay.WatcherOptions{Table: relaySide.Table.String(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	go func() { defer wg.Done(); _ = relay.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	select {
	case <-w.Ready():
	case <-time.After(wait.Stall):
		t.Fatal("the watcher did not start reading")
	}
	time.Sleep(100 * time.Millisecond) // the relay's first poll is over
	evs := events(t, 20, 4)
	ins := "INSERT INTO " + relaySide.Table.String() + " (event_id, aggregate_type, aggregate_id, event_type, payload) VALUES (?, ?, ?, ?, ?)"
	var worst time.Duration
	for i, ev := range evs {
		start := time.Now()
		if _, err := producer.ExecContext(ctx, ins, ev.ID, ev.AggregateType, ev.AggregateID, ev.EventType, string(ev.Payload)); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		err := rec.WaitDistinct(wctx, i+1)
		wcancel()
		if err != nil {
			t.Fatalf("event %d not published 10s after its commit (the relay polls hourly): %v", i, err)
		}
		worst = max(worst, time.Since(start))
	}
	t.Logf("slowest commit-to-publish of %d: %s", len(evs), worst)
	// The relay may publish an event (in the quick look again after an
	// earlier wake-up) before the watcher has read its commit: give the
	// watcher a moment to count it.
	wait.For(t, "a wake-up per insert", func() (bool, any) {
		st := w.Stats()
		return st.Wakes >= int64(len(evs)), st.Wakes
	})
	if st := w.Stats(); st.Wakes < int64(len(evs)) || st.Connects != 1 {
		t.Errorf("watcher stats %+v: want a wake per insert", st)
	}
}

// Without the binlog's privileges the watcher says so once and returns:
// the relay polls.
func TestWatcherWithoutPrivilegeFallsBackToPolling(t *testing.T) {
	t.Parallel()
	dsn := testenv.MySQLDSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	user := "w_" + strings.TrimPrefix(cfg.DBName, "t_")
	for _, q := range []string{
		fmt.Sprintf("CREATE USER '%s'@'127.0.0.1' IDENTIFIED BY 'pw'", user),
		fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON `%s`.* TO '%s'@'127.0.0.1'", cfg.DBName, user),
	} {
		if _, err := admin.ExecContext(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _, _ = admin.Exec(fmt.Sprintf("DROP USER '%s'@'127.0.0.1'", user)) })
	cfg.User, cfg.Passwd = user, "pw"
	var logs bytes.Buffer
	var mu sync.Mutex
	w, err := binlogrelay.NewWatcher(cfg.FormatDSN(), core.NotifierFunc(func() {}), binlogrelay.WatcherOptions{
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(t.Context()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v, want nil (polling)", err)
		}
	case <-time.After(wait.Stall):
		t.Fatal("the watcher without privileges did not give up")
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "no binlog wake-up; the relay polls"); n != 1 {
		t.Errorf("%d fallback lines, want 1:\n%s", n, logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
