package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/logrelay"
)

// Log mode through the CLI: migrate --mode log, relay --mode log with its
// metrics, log status, log drop back to table mode.
func TestLogMode(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	slot := "cli_" + hex.EncodeToString(b)
	names := logrelay.Names{Slot: slot, Publication: slot}
	t.Cleanup(func() { // before the database is dropped
		_ = logrelay.Teardown(context.Background(), dsn, names, logrelay.TeardownOptions{Force: true})
	})
	ok(t, dsn, "migrate", "--mode", "log", "--slot", slot, "--publication", slot)
	f := openFixture(t, "pgx", dsn, dsn)
	evs := f.enqueue(t, "order.created", "o-1", 30)
	if evs[0].Seq != 0 || f.count(t, "true") != 0 {
		t.Fatal("the events were written to the table: the trigger is not in place")
	}

	relay, stdout, stderr, addr := startRelay(t, dsn, "--mode", "log", "--slot", slot, "--publication", slot,
		"--broker", "log://", "--stats-interval", "100ms")
	wait.Until(t, "the 30 events on the relay's stdout", func() bool {
		return stdout.Lines() >= 30
	})
	got := map[string]bool{}
	for _, id := range sinkIDs(t, stdout.String()) {
		got[id] = true
	}
	for _, ev := range evs {
		if !got[ev.ID] {
			t.Fatalf("event %s not published", ev.ID)
		}
	}
	wait.Until(t, "the log metrics", func() bool {
		m := scrape(t, addr)
		return m["txoutbox_log_streaming"] == 1 && m["txoutbox_log_published_total"] == 30 &&
			m["txoutbox_log_table_writes_total"] == 0 && m["txoutbox_log_retained_wal_bytes"] > 0
	})

	r := ok(t, dsn, "log", "status", "--slot", slot, "--publication", slot, "--format", "json")
	var st logStatusJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("log status: %v\n%s", err, r.stdout)
	}
	if !st.Exists || !st.Streaming || !st.TriggerInstalled || st.Invalidated || st.PendingInTable != 0 {
		t.Errorf("log status while streaming: %+v", st)
	}
	r = ok(t, dsn, "log", "status", "--slot", slot, "--publication", slot)
	if !strings.Contains(r.stdout, "streaming") || !strings.Contains(r.stdout, "retained WAL") {
		t.Errorf("log status table:\n%s", r.stdout)
	}

	// The console shows the slot, streaming, through its own pool.
	caddr, _ := startConsole(t, dsn, "--console-slot", slot)
	resp, err := http.Get(caddr + "log")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "slot "+slot) || !strings.Contains(string(page), `id="slot-state">yes<`) {
		t.Errorf("GET %slog: %d\n%s", caddr, resp.StatusCode, page)
	}

	// stats says where the pending events are in log mode.
	r = ok(t, dsn, "stats", "--slot", slot)
	if !strings.Contains(r.stdout, "log mode: the table holds the failed events") || !strings.Contains(r.stdout, "streaming true") {
		t.Errorf("stats in log mode:\n%s", r.stdout)
	}
	r = ok(t, dsn, "stats", "--slot", slot, "--format", "json")
	var sj statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &sj); err != nil || sj.LogMode == nil || !sj.LogMode.Streaming || sj.LogMode.Slot != slot {
		t.Errorf("stats --format json in log mode: %v\n%s", err, r.stdout)
	}

	// Back to table mode: the relay confirmed everything, so drop goes
	// through and the log relay stops, saying why.
	ok(t, dsn, "log", "drop", "--slot", slot, "--publication", slot, "--wait", "20s")
	if code := exitCode(t, relay, 20*time.Second); code == 0 {
		t.Errorf("the log relay exited 0 after its slot was dropped\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "replication slot does not exist") {
		t.Errorf("the relay's log does not say the slot is gone:\n%s", stderr.String())
	}
	if after := f.enqueue(t, "order.created", "o-1", 1); after[0].Seq == 0 || f.count(t, "true") != 1 {
		t.Error("after log drop the events do not land in the table")
	}
}

func TestLogModeUsageErrors(t *testing.T) {
	t.Parallel()
	sqlite := "sqlite:" + t.TempDir() + "/x.db"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"relay", "--mode", "log", "--drain", "--broker", "log://", "--dsn", "postgres://127.0.0.1:1/x"}, "--drain has no meaning"},
		{[]string{"relay", "--mode", "tail", "--broker", "log://", "--dsn", "postgres://127.0.0.1:1/x"}, `--mode "tail"`},
		{[]string{"log", "create", "--dsn", sqlite}, "needs PostgreSQL (logical replication) or MySQL/MariaDB"},
		{[]string{"log", "recover", "--dsn", "postgres://127.0.0.1:1/x"}, "MySQL's and MariaDB's"},
		{[]string{"log", "create", "--dsn", "postgres://127.0.0.1:1/x", "--slot", "Bad-Slot"}, "Bad-Slot"},
		{[]string{"migrate", "--mode", "log", "--print"}, "cannot be printed"},
	} {
		r := run(t, "", nil, c.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("txoutbox %v: exit %d, stderr %q; want exit %d naming %q", c.args, r.code, r.stderr, exitUsage, c.want)
		}
	}
}

// Log mode on MariaDB through the CLI: migrate --mode log, relay --mode
// log with its metrics, log status, a graceful stop that stores the
// position (the next relay sends nothing again), log drop back to table
// mode.
func TestLogModeMySQL(t *testing.T) {
	t.Parallel()
	driverDSN, dsn := mysqlDSNs(t)
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	stream := "cli_" + hex.EncodeToString(b)
	r := ok(t, dsn, "migrate", "--mode", "log", "--stream", stream)
	if !strings.Contains(r.stdout, "stream "+stream) {
		t.Errorf("migrate --mode log does not name the stream:\n%s", r.stdout)
	}
	f := openFixture(t, "mysql", driverDSN, dsn)
	evs := f.enqueue(t, "order.created", "o-1", 30)
	if f.count(t, "published_at IS NULL") != 0 {
		t.Fatal("the events were born for the table relay: published_at's default is not in place")
	}
	relay, stdout, _, addr := startRelay(t, dsn, "--mode", "log", "--stream", stream, "--broker", "log://", "--stats-interval", "100ms")
	wait.Until(t, "the 30 events on the relay's stdout", func() bool {
		return stdout.Lines() >= 30
	})
	got := map[string]bool{}
	for _, id := range sinkIDs(t, stdout.String()) {
		got[id] = true
	}
	for _, ev := range evs {
		if !got[ev.ID] {
			t.Fatalf("event %s not published", ev.ID)
		}
	}
	wait.Until(t, "the log metrics", func() bool {
		m := scrape(t, addr)
		return m["txoutbox_log_streaming"] == 1 && m["txoutbox_log_published_total"] == 30 &&
			m["txoutbox_log_table_writes_total"] == 0 && m["txoutbox_log_binlog_purged"] == 0
	})
	r = ok(t, dsn, "log", "status", "--stream", stream, "--format", "json")
	var st binlogStatusJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("log status: %v\n%s", err, r.stdout)
	}
	if !st.Exists || !st.Streaming || !st.DefaultSet || !st.FilesHeld || st.PendingInTable != 0 {
		t.Errorf("log status while streaming: %+v", st)
	}
	r = ok(t, dsn, "log", "status", "--stream", stream)
	if !strings.Contains(r.stdout, "binlog held") || !strings.Contains(r.stdout, "position") {
		t.Errorf("log status table:\n%s", r.stdout)
	}
	// The console shows the stream, streaming, through its own pool.
	caddr, _ := startConsole(t, dsn, "--console-stream", stream)
	resp, err := http.Get(caddr + "log")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "binlog stream "+stream) ||
		!strings.Contains(string(page), `id="stream-state">yes<`) || !strings.Contains(string(page), `id="files-held">yes<`) {
		t.Errorf("GET %slog: %d\n%s", caddr, resp.StatusCode, page)
	}
	// A graceful stop stores the position: the next relay sends nothing
	// again.
	if err := relay.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, relay, 20*time.Second); code != 0 {
		t.Fatalf("the log relay exited %d on SIGTERM", code)
	}
	_, stdout2, _, _ := startRelay(t, dsn, "--mode", "log", "--stream", stream, "--broker", "log://")
	more := f.enqueue(t, "order.created", "o-2", 5)
	wait.Until(t, "the 5 new events", func() bool { return stdout2.Lines() >= 5 })
	time.Sleep(300 * time.Millisecond)
	if ids := sinkIDs(t, stdout2.String()); len(ids) != len(more) {
		t.Errorf("the second relay published %d events, want the %d new ones only", len(ids), len(more))
	}
	ok(t, dsn, "log", "drop", "--stream", stream, "--wait", "20s")
	f.enqueue(t, "order.created", "o-3", 1)
	if f.count(t, "published_at IS NULL") != 1 {
		t.Error("after log drop the events are not the table relay's")
	}
}
