package wait_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// A wait that keeps seeing progress outlives Stall many times over.
func TestProgressOutlivesTheStallLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		err := wait.Poll(t.Context(), "a slow count", func() (bool, any) {
			n := int(time.Since(start) / time.Second) // one more each second
			return time.Since(start) > 5*wait.Stall, n
		})
		if err != nil {
			t.Fatalf("a wait that progressed failed: %v", err)
		}
	})
}

// A value that stands still fails after Stall, and the error names what
// was awaited and what was last seen.
func TestStallFailsAndSaysWhatItSaw(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		err := wait.Poll(t.Context(), "3 deliveries", func() (bool, any) { return false, "2 of 3" })
		if err == nil {
			t.Fatal("a stalled wait succeeded")
		}
		if took := time.Since(start); took < wait.Stall || took > wait.Stall+time.Second {
			t.Errorf("failed after %s, want the stall limit %s", took, wait.Stall)
		}
		for _, want := range []string{"3 deliveries", "2 of 3", "nothing changed"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	})
}

// A wait that moves forever ends at Cap.
func TestCapEndsEndlessProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		n := 0
		err := wait.Poll(t.Context(), "a counter", func() (bool, any) { n++; return false, n })
		if err == nil || !strings.Contains(err.Error(), "kept changing") {
			t.Fatalf("got %v, want the cap's error", err)
		}
		if took := time.Since(start); took < wait.Cap {
			t.Errorf("gave up after %s, before the cap %s", took, wait.Cap)
		}
	})
}

func TestUntilReturnsOnceTrue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		wait.Until(t, "a second to pass", func() bool { return time.Since(start) >= time.Second })
		if time.Since(start) < time.Second {
			t.Fatal("returned before the condition held")
		}
	})
}

// A Context lives while its progress moves and ends, with the stall as its
// cause, once it stands still.
func TestContextEndsOnAStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var n atomic.Int64
		ctx := wait.Context(t, "deliveries", 10*time.Second, func() any { return n.Load() })
		for range 30 { // 30 s of progress, three times the stall limit
			time.Sleep(time.Second)
			n.Add(1)
		}
		if ctx.Err() != nil {
			t.Fatalf("the context ended while progress was made: %v", context.Cause(ctx))
		}
		<-ctx.Done()
		if took := time.Since(start); took < 40*time.Second {
			t.Errorf("ended %s after the start, before 10 s without progress", took)
		}
		if cause := context.Cause(ctx); cause == nil || !strings.Contains(cause.Error(), "deliveries") {
			t.Errorf("cause %v does not name the wait", cause)
		}
	})
}
