// Package tier says which tier of the test suite is running: the edit loop
// (go test -short), the default (make test) or the long tier (make
// test-long), so that a test of many cells, processes or events can leave
// the quick loop and grow in the long one.
package tier

import (
	"os"
	"testing"
)

// Long reports whether the long tier runs (TXOUTBOX_LONG=1, set by make
// test-long): long faults, full matrices, soaks.
func Long() bool { return os.Getenv("TXOUTBOX_LONG") == "1" }

// SkipShort skips t in the edit loop (go test -short). make test and make
// test-long run it; a test skipped here must be one of those that judge
// the same code from many sides (matrices, kills, soaks), never the only
// test of a feature.
func SkipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("left out of go test -short: make test runs it")
	}
}
