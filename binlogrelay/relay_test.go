package binlogrelay_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/binlogrelay"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/logmode"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

var quiet = slog.New(slog.DiscardHandler)

func events(t *testing.T, n, aggs int) []core.Event {
	t.Helper()
	evs := make([]core.Event, n)
	for i := range evs {
		ev, err := core.NewEvent("order", fmt.Sprintf("agg-%d", i%aggs), "binlog.test", map[string]int{"i": i})
		if err != nil {
			t.Fatal(err)
		}
		evs[i] = ev
	}
	return evs
}

func enqueue(t *testing.T, l *fixtures.BinLog, evs []core.Event, per int) {
	t.Helper()
	for i := 0; i < len(evs); i += per {
		if err := l.Enqueue(t.Context(), evs[i:min(i+per, len(evs))], true); err != nil {
			t.Fatal(err)
		}
	}
}

func newRelay(t *testing.T, l *fixtures.BinLog, pub core.Publisher, opts binlogrelay.Options) *logmode.Relay {
	t.Helper()
	if opts.Relay.Logger == nil {
		opts.Relay.Logger = quiet
	}
	r, err := l.Relay(pub, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
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

func count(t *testing.T, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// Committed events arrive, once each, in commit order; rolled-back ones
// never, also when their transaction wrote other tables; the happy path
// writes nothing per event (every row keeps the published_at it was born
// with, and no row is ever unpublished).
func TestCommittedOnlyNoWritePerEvent(t *testing.T) {
	t.Parallel()
	l := fixtures.NewBinLog(t, "", fixtures.Options{SkipInbox: true})
	rec := outboxtest.NewRecorder()
	r := newRelay(t, l, rec, binlogrelay.Options{})
	run(t, r)
	evs := events(t, 300, 7)
	enqueue(t, l, evs[:100], 10)
	// Rolled back after the outbox insert, with the orders row beside it.
	rolled := events(t, 20, 3)
	for i := 0; i < len(rolled); i += 5 {
		if err := l.Enqueue(t.Context(), rolled[i:i+5], false); err != nil {
			t.Fatal(err)
		}
	}
	enqueue(t, l, evs[100:], 25)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rec.WaitDistinct(ctx, len(evs)); err != nil {
		t.Fatal(err)
	}
	if err := l.Settled(ctx); err != nil {
		t.Fatal(err)
	}
	got := rec.Events()
	for i, ev := range evs {
		if i >= len(got) || got[i].ID != ev.ID {
			t.Fatalf("delivery %d is not event %s (commit order)", i, ev.ID)
		}
	}
	if len(got) != len(evs) {
		t.Errorf("%d deliveries for %d events: the stream sent some twice or a rolled-back one", len(got), len(evs))
	}
	if n := count(t, l.DB.DB, "SELECT COUNT(*) FROM "+l.Table.String()+" WHERE published_at IS NULL OR attempt_count > 0"); n != 0 {
		t.Errorf("%d rows written back on the happy path", n)
	}
	if c := r.Counters(); c.TableWrites != 0 || c.Published != int64(len(evs)) || c.Confirms == 0 {
		t.Errorf("counters %+v", c)
	}
}
