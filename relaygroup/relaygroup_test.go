package relaygroup_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/relaygroup"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// counter is a member's Run that counts its starts and the ones running.
type counter struct {
	starts, live atomic.Int64
	fail         atomic.Bool
}

func (c *counter) run(ctx context.Context) error {
	c.starts.Add(1)
	c.live.Add(1)
	defer c.live.Add(-1)
	if c.fail.Load() {
		return errors.New("database does not exist")
	}
	<-ctx.Done()
	return nil
}

func TestSetReconcilesRunningMembers(t *testing.T) {
	t.Parallel()
	g, err := relaygroup.New(relaygroup.Options{Logger: quiet, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var a, b, c counter
	if err := g.Set([]relaygroup.Member{{Name: "a", Spec: "1", Run: a.run}, {Name: "b", Spec: "1", Run: b.run}}); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	wait.Until(t, "a and b running", func() bool { return a.live.Load() == 1 && b.live.Load() == 1 })

	// b's spec changes, c is added, a is kept.
	if err := g.Set([]relaygroup.Member{{Name: "a", Spec: "1", Run: a.run}, {Name: "b", Spec: "2", Run: b.run}, {Name: "c", Run: c.run}}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "b restarted and c started", func() bool { return b.starts.Load() == 2 && b.live.Load() == 1 && c.live.Load() == 1 })
	if a.starts.Load() != 1 {
		t.Errorf("a was started %d times; an unchanged member must run on", a.starts.Load())
	}
	// a is removed: Set returns once it stopped.
	if err := g.Set([]relaygroup.Member{{Name: "b", Spec: "2", Run: b.run}, {Name: "c", Run: c.run}}); err != nil {
		t.Fatal(err)
	}
	if a.live.Load() != 0 {
		t.Error("Set returned while the removed member still ran")
	}
	if got := len(g.Status()); got != 2 {
		t.Errorf("status lists %d members, want 2", got)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if b.live.Load() != 0 || c.live.Load() != 0 {
		t.Error("Run returned while members still ran")
	}
}

// A failing member is started again with backoff, and never stops the
// others.
func TestFailingMemberRestartsAlone(t *testing.T) {
	t.Parallel()
	g, err := relaygroup.New(relaygroup.Options{Logger: quiet, MinBackoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var bad, good counter
	bad.fail.Store(true)
	if err := g.Set([]relaygroup.Member{{Name: "bad", Run: bad.run}, {Name: "good", Run: good.run}}); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = g.Run(ctx) }()
	wait.Until(t, "three restarts of the failing member", func() bool { return bad.starts.Load() >= 4 })
	if good.starts.Load() != 1 || good.live.Load() != 1 {
		t.Errorf("the healthy member: %d starts, %d running; want it started once and running", good.starts.Load(), good.live.Load())
	}
	var st relaygroup.Status
	for _, s := range g.Status() {
		if s.Name == "bad" {
			st = s
		}
	}
	if st.Restarts < 3 || st.LastError != "database does not exist" {
		t.Errorf("status of the failing member: %+v", st)
	}
	bad.fail.Store(false)
	wait.Until(t, "the failing member running once healed", func() bool { return bad.live.Load() == 1 })
	stop()
	wg.Wait()
}

func TestSetRefusesInvalidMembers(t *testing.T) {
	t.Parallel()
	g, err := relaygroup.New(relaygroup.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run := func(context.Context) error { return nil }
	for name, ms := range map[string][]relaygroup.Member{
		"no name":   {{Run: run}},
		"duplicate": {{Name: "a", Run: run}, {Name: "a", Run: run}},
		"no run":    {{Name: "a"}},
	} {
		if err := g.Set(ms); !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("%s: Set returned %v, want core.ErrInvalidOptions", name, err)
		}
	}
	if _, err := relaygroup.New(relaygroup.Options{MinBackoff: time.Second, MaxBackoff: time.Millisecond}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("MaxBackoff below MinBackoff: %v", err)
	}
}
