package main

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testenv"
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
