package faultproxy_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/testing/faultproxy"
)

// through returns the PostgreSQL DSN of the test server with its host and
// port replaced by the proxy's, and the proxy.
func through(t *testing.T) (string, *faultproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(testenv.Env(t, "TXOUTBOX_PG_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.Start(t, u.Host)
	u.Host = p.Addr()
	return u.String(), p
}

func query(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var n int
	return conn.QueryRow(ctx, "SELECT count(*) FROM generate_series(1, 10)").Scan(&n)
}

// Each fault does what it says to a real PostgreSQL connection, and Heal
// undoes it.
func TestFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, time.Second) }

	t.Run("blackhole holds an open connection and new ones", func(t *testing.T) {
		t.Parallel()
		dsn, p := through(t)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if err := p.Blackhole(); err != nil {
			t.Fatal(err)
		}
		c, cancel := short()
		defer cancel()
		if err := conn.Ping(c); !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "timeout") {
			t.Fatalf("ping through a blackhole: %v, want a timeout", err)
		}
		c2, cancel2 := short()
		defer cancel2()
		if err := query(c2, dsn); err == nil {
			t.Fatal("a new connection through a blackhole answered")
		}
		if err := p.Heal(); err != nil {
			t.Fatal(err)
		}
		if err := query(ctx, dsn); err != nil {
			t.Fatalf("after Heal: %v", err)
		}
	})
	t.Run("reset breaks connections", func(t *testing.T) {
		t.Parallel()
		dsn, p := through(t)
		if err := p.Reset(); err != nil {
			t.Fatal(err)
		}
		c, cancel := short()
		defer cancel()
		if err := query(c, dsn); err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("through a reset: %v, want a connection error at once", err)
		}
		if err := p.Heal(); err != nil {
			t.Fatal(err)
		}
		if err := query(ctx, dsn); err != nil {
			t.Fatalf("after Heal: %v", err)
		}
	})
	t.Run("refuse refuses, on the same address", func(t *testing.T) {
		t.Parallel()
		dsn, p := through(t)
		addr := p.Addr()
		p.Refuse()
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Fatal("a refused proxy accepted a connection")
		} else if !strings.Contains(err.Error(), "refused") {
			t.Fatalf("dial: %v, want connection refused", err)
		}
		if err := p.Heal(); err != nil {
			t.Fatal(err)
		}
		if p.Addr() != addr {
			t.Fatalf("healed on %s, not %s", p.Addr(), addr)
		}
		if err := query(ctx, dsn); err != nil {
			t.Fatalf("after Heal: %v", err)
		}
	})
	t.Run("latency delays each round trip", func(t *testing.T) {
		t.Parallel()
		dsn, p := through(t)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if err := p.Latency(150 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := conn.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		// A lower bound only: the fault is there (one way at least).
		if took := time.Since(start); took < 150*time.Millisecond {
			t.Fatalf("a round trip took %v through 150ms of latency", took)
		}
	})
	t.Run("bandwidth throttles", func(t *testing.T) {
		t.Parallel()
		dsn, p := through(t)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if err := p.Bandwidth(20); err != nil { // 20 KB/s
			t.Fatal(err)
		}
		start := time.Now()
		var s string
		if err := conn.QueryRow(ctx, "SELECT repeat('x', 40000)").Scan(&s); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < time.Second {
			t.Fatalf("40 KB at 20 KB/s took %v", took)
		}
	})
}
