package wake

import (
	"database/sql"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

func TestOneSignalPerHandleAndTable(t *testing.T) {
	a, b := new(sql.DB), new(sql.DB)
	if For(a, "t") != For(a, "t") {
		t.Fatal("two signals for one handle and table")
	}
	if For(a, "t") == For(b, "t") || For(a, "t") == For(a, "u") {
		t.Fatal("handles or tables share a signal")
	}
	var n atomic.Int32
	defer For(a, "t").Subscribe(func() { n.Add(1) })()
	For(a, "t").Notify()
	if n.Load() != 1 {
		t.Fatalf("subscriber called %d times, want 1", n.Load())
	}
	runtime.KeepAlive(b)
}

func TestSignalsGoWithTheirHandle(t *testing.T) {
	func() {
		h := new(sql.DB)
		For(h, "gone")
	}()
	wait.For(t, "the signals to go with their handle", func() (bool, any) {
		runtime.GC()
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for k := range signals {
			if k.table == "gone" {
				n++
			}
		}
		return n == 0, n
	})
}
