package pgxbridge

import (
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

func TestOneBridgePerPool(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	a, b := testenv.OpenPgxPool(t, dsn), testenv.OpenPgxPool(t, dsn)
	if DB(a) != DB(a) {
		t.Fatal("two bridges for one pool")
	}
	if DB(a) == DB(b) {
		t.Fatal("two pools share a bridge")
	}
	var one int
	if err := DB(a).QueryRowContext(t.Context(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("query through the bridge: %d, %v", one, err)
	}
	// The bridge keeps no connection of its own: after the query, the
	// pool has every connection back.
	if st := a.Stat(); st.AcquiredConns() != 0 {
		t.Fatalf("%d connections still acquired after the query", st.AcquiredConns())
	}
}

func TestBridgeGoesWithItsPool(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	var k weak.Pointer[pgxpool.Pool]
	func() {
		p, err := pgxpool.New(t.Context(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		k = weak.Make(p)
		if err := DB(p).PingContext(t.Context()); err != nil {
			t.Fatal(err)
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		mu.Lock()
		_, left := bridges[k]
		mu.Unlock()
		if !left {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the bridge outlived its pool")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
