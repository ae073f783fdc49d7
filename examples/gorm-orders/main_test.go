package main

import (
	"net/url"

	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/txoutbox/txoutbox/core"

	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// The relay polls only once an hour in these tests: an event that arrives
// at all was published on the plugin's wake-up after the commit.
func init() { pollInterval = time.Hour }

func TestOrdersServiceSQLite(t *testing.T) {
	t.Parallel()
	testService(t, "", filepath.Join(t.TempDir(), "orders.db"))
}

func TestOrdersServicePostgres(t *testing.T) {
	t.Parallel()
	testService(t, testenv.PostgresDSN(t), "")
}

func TestOrdersServiceMariaDB(t *testing.T) {
	t.Parallel()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	testService(t, "mysql://"+url.UserPassword(cfg.User, cfg.Passwd).String()+"@"+cfg.Addr+"/"+cfg.DBName, "")
}

// testService runs the service, creates orders over HTTP and waits for
// their order.created events at the broker.
func testService(t *testing.T, dsn, file string) {
	ctx := t.Context()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := newApp(ctx, dsn, file, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	msgs, err := a.subscribe(ctx, EventOrderCreated)
	if err != nil {
		t.Fatal(err)
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- a.relay.Run(relayCtx) }()
	defer func() {
		stopRelay()
		if err := <-relayDone; err != nil {
			t.Error(err)
		}
	}()
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()

	for _, bad := range []string{`{`, `{"buyer_id":"","total":5}`, `{"buyer_id":"b","total":0}`} {
		resp, err := http.Post(srv.URL+"/orders", "application/json", strings.NewReader(bad))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("POST %s: %s, want 400", bad, resp.Status)
		}
	}

	// The relay polls once an hour (init): each event arrives on the
	// plugin's wake-up after the commit, or never.
	for i := range 3 {
		body, _ := json.Marshal(createOrderRequest{BuyerID: "b-42", Total: int64(1000 + i)})
		resp, err := http.Post(srv.URL+"/orders", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var o Order
		err = json.NewDecoder(resp.Body).Decode(&o)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated || o.ID == 0 {
			t.Fatalf("POST /orders: %s %+v %v", resp.Status, o, err)
		}
		select {
		case msg := <-msgs:
			msg.Ack()
			var p OrderCreated
			if err := json.Unmarshal(msg.Payload, &p); err != nil {
				t.Fatal(err)
			}
			if p.OrderID != o.ID || p.BuyerID != "b-42" || p.Total != o.Total || !p.CreatedAt.Equal(o.CreatedAt) {
				t.Fatalf("event payload %+v for order %+v", p, o)
			}
			if msg.Metadata.Get(core.HeaderAggregateID) != strconv.FormatInt(p.OrderID, 10) || msg.Metadata.Get(core.HeaderEventType) != EventOrderCreated {
				t.Fatalf("metadata %v", msg.Metadata)
			}
		case <-time.After(wait.Stall):
			t.Fatalf("no order.created for order %d %s after its commit: the relay was not woken", o.ID, wait.Stall)
		}
	}
}
