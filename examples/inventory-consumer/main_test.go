package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// The demo sends every order twice; the stock must show each order once:
// 5 orders of 2 apples and 1 pear from 100 each.
const wantDemo = "orders handled: 5\nstock apple: 90\nstock pear: 95\n"

func runDemo(t *testing.T, cfg config) {
	t.Helper()
	cfg.Demo, cfg.Orders, cfg.Consumer, cfg.Topic = true, 5, "inventory-"+testenv.RandomSuffix(), "order.created."+testenv.RandomSuffix()
	cfg.Log = slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, cfg, &out); err != nil {
		t.Fatalf("run: %v", err)
	}
	if out.String() != wantDemo {
		t.Fatalf("demo printed\n%s\nwant\n%s", out.String(), wantDemo)
	}
}

func TestDemoSQLiteGoChannel(t *testing.T) {
	t.Parallel()
	runDemo(t, config{DB: "sqlite", Broker: "gochannel",
		DSN: "file:" + filepath.Join(t.TempDir(), "inv.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)"})
}

func TestDemoPostgresGoChannel(t *testing.T) {
	t.Parallel()
	runDemo(t, config{DB: "postgres", Broker: "gochannel", DSN: testenv.PostgresDSN(t)})
}

func TestDemoPostgresRabbitMQ(t *testing.T) {
	t.Parallel()
	runDemo(t, config{DB: "postgres", Broker: "amqp", DSN: testenv.PostgresDSN(t), AMQPURL: testenv.AMQPURL(t)})
}

// A consumer started while its broker is down waits for it (one warning),
// instead of exiting; -fail-fast exits at once.
func TestWaitsForTheBroker(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	cfg := config{DB: "sqlite", DSN: "file:" + filepath.Join(t.TempDir(), "i.db") + "?_pragma=busy_timeout(10000)", Broker: "amqp",
		AMQPURL: "amqp://guest:guest@127.0.0.1:1/", Consumer: "inventory", Topic: "order.created",
		Log: slog.New(slog.NewTextHandler(&logs, nil))}
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := run(ctx, cfg, &bytes.Buffer{}); err == nil || time.Since(start) < 1400*time.Millisecond {
		t.Fatalf("run = %v after %s, want it to wait for the broker until the context ended", err, time.Since(start))
	}
	if n := bytes.Count(logs.Bytes(), []byte("broker does not answer")); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, logs.String())
	}
	// With -fail-fast it fails on the broker, not on the context: one
	// that waited would run into the stall limit's deadline.
	cfg.FailFast = true
	ffctx, ffcancel := context.WithTimeout(t.Context(), wait.Stall)
	defer ffcancel()
	if err := run(ffctx, cfg, &bytes.Buffer{}); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("-fail-fast: %v, want the broker's error at once", err)
	}
}
