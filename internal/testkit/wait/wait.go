// Package wait is how the tests wait for what a real server, process or
// goroutine does: they poll until it is done, and fail only when nothing
// has changed for a long while. A wait never fails because a fixed
// deadline passed while progress was still being made, so a slow machine
// makes a test slower, never red.
package wait

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// Stall is how long a wait may see the same progress before it fails: a
// liveness limit that a correct run never comes near on a loaded machine.
// TXOUTBOX_WAIT_STALL (a time.Duration) overrides it, for instance to fail
// fast while debugging.
var Stall = envDuration("TXOUTBOX_WAIT_STALL", time.Minute)

// Cap bounds a whole wait, progress or not, so that a wait that keeps
// moving without ever finishing (a counter that climbs past its target
// forever) still ends before the test binary's own timeout.
var Cap = 10 * time.Minute

// every is the pause between two polls.
const every = 20 * time.Millisecond

// For polls check until it reports done. check also returns what it sees
// now (a count, a state, the last line of a log): each change of that
// value is progress and starts the stall clock again. For fails t when the
// value stood still for Stall, or Cap passed, naming what it waited for,
// the last value seen and how long it had stood still. It returns early,
// without failing, when t's context ends.
func For(t testing.TB, what string, check func() (done bool, seen any)) {
	t.Helper()
	ForStall(t, what, Stall, check)
}

// ForStall is For with a stall limit of its own instead of Stall: for a
// suite whose users set how long their service may go without progress.
func ForStall(t testing.TB, what string, stall time.Duration, check func() (done bool, seen any)) {
	t.Helper()
	if err := poll(t.Context(), what, stall, check); err != nil && t.Context().Err() == nil {
		t.Fatal(err)
	}
}

// Until is For for a condition that has no progress of its own to show:
// it fails when cond has stayed false for Stall.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	For(t, what, func() (bool, any) { return cond(), nil })
}

// Poll is For for code that has no testing.TB at hand, a goroutine or a
// fixture that returns errors: it returns nil once check is done, ctx's
// error when ctx ends first, or an error saying what stalled.
func Poll(ctx context.Context, what string, check func() (done bool, seen any)) error {
	return poll(ctx, what, Stall, check)
}

func poll(ctx context.Context, what string, stall time.Duration, check func() (done bool, seen any)) error {
	if stall <= 0 {
		stall = Stall
	}
	start := time.Now()
	var last string
	moved := start
	for first := true; ; first = false {
		done, seen := check()
		if done {
			return nil
		}
		now := time.Now()
		if s := fmt.Sprint(seen); first || s != last {
			last, moved = s, now
		}
		if still := now.Sub(moved); still >= stall {
			return fmt.Errorf("waited for %s: nothing changed for %s (last seen: %s)", what, still.Round(time.Second), describe(seen))
		}
		if total := now.Sub(start); total >= Cap {
			return fmt.Errorf("waited for %s: still not done after %s though it kept changing (last seen: %s)", what, total.Round(time.Second), describe(seen))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}

func describe(seen any) string {
	if seen == nil {
		return "nothing to show, the condition stayed false"
	}
	return fmt.Sprint(seen)
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			return d
		}
	}
	return def
}

// Context returns a context for a wait that may take as long as it keeps
// moving: it ends when t ends, or once seen has shown the same value for
// stall (Stall when zero), or at Cap. context.Cause tells which, in the
// words of Poll's error.
func Context(t testing.TB, what string, stall time.Duration, seen func() any) context.Context {
	ctx, cancel := context.WithCancelCause(t.Context())
	t.Cleanup(func() { cancel(nil) })
	go func() {
		cancel(poll(ctx, what, stall, func() (bool, any) { return false, seen() }))
	}()
	return ctx
}
