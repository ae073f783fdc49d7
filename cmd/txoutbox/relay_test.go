package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/logbuf"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// scrape returns the samples of a Prometheus text exposition, keyed by
// name{labels} exactly as exposed.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

func healthz(t *testing.T, addr string) (int, healthReport) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("healthz: %v", err)
	}
	defer resp.Body.Close()
	var rep healthReport
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatalf("healthz body: %v", err)
	}
	return resp.StatusCode, rep
}

// TestRelayMetricsAndGracefulShutdown runs a relay against a slow sink,
// scrapes its /metrics while it works, then stops it with SIGTERM in the
// middle of the run: the batch in flight must finish and be marked, every
// event printed must be marked published exactly once, and the next relay
// must publish exactly the rest.
func TestRelayMetricsAndGracefulShutdown(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const total = 60
	evs := f.enqueue(t, "order.created", "1", total)
	// An event the broker always refuses, waiting for ten minutes: the outbox
	// is lagging.
	f.enqueue(t, "order.stuck", "2", 1)
	f.exec(t, "UPDATE outbox_events SET created_at = now() - interval '10 minutes', next_attempt_at = now() - interval '10 minutes' WHERE event_type = 'order.stuck'")

	cmd, stdout, stderr, addr := startRelay(t, f.dsn,
		"--broker", "log://?delay=250ms&fail_types=order.stuck",
		"--batch-size", "10", "--poll-interval", "50ms", "--stats-interval", "100ms",
		"--lag-threshold", "1m", "--max-attempts", "100", "--initial-backoff", "1h")

	// The HTTP server answers while the relay still checks its
	// dependencies ("starting"); it turns ok once both answered.
	wait.Until(t, "healthz ok", func() bool {
		code, rep := healthz(t, addr)
		return code == http.StatusOK && rep.Status == "ok"
	})
	var first map[string]float64
	wait.Until(t, "10 events published according to /metrics", func() bool {
		first = scrape(t, addr)
		return first[`txoutbox_events_published_total{event_type="order.created"}`] >= 10 &&
			first["txoutbox_lagging"] == 1
	})
	for name, want := range map[string]float64{
		"txoutbox_lag_threshold_seconds":                            60,
		"txoutbox_lagging":                                          1,
		`txoutbox_pending_events_by_type{event_type="order.stuck"}`: 1,
		`txoutbox_events_failed_total{event_type="order.stuck"}`:    1,
	} {
		if first[name] != want {
			t.Errorf("%s = %v, want %v", name, first[name], want)
		}
	}
	for _, name := range []string{
		`txoutbox_publish_duration_seconds_count{result="partial"}`,
		`txoutbox_claim_duration_seconds_count{result="ok"}`,
		`txoutbox_mark_duration_seconds_count{result="ok"}`,
		"txoutbox_event_lag_seconds_count",
		"txoutbox_oldest_pending_age_seconds",
		"go_goroutines",
		// The pool's own figures, and its size (poolSizes).
		`go_sql_max_open_connections{db_name="outbox"}`,
	} {
		if first[name] <= 0 {
			t.Errorf("%s = %v, want > 0", name, first[name])
		}
	}
	if _, ok := first[`go_sql_max_idle_closed_total{db_name="outbox"}`]; !ok || first[`go_sql_max_open_connections{db_name="outbox"}`] != maxConns {
		t.Errorf("go_sql_max_idle_closed_total present %v, go_sql_max_open_connections %v: want the pool's metrics, %d open at most", ok, first[`go_sql_max_open_connections{db_name="outbox"}`], maxConns)
	}
	if first["txoutbox_oldest_pending_age_seconds"] < 599 {
		t.Errorf("oldest pending age %v, want the stuck event's 10 minutes", first["txoutbox_oldest_pending_age_seconds"])
	}
	if !strings.Contains(stderr.String(), `"msg":"txoutbox: outbox is lagging"`) {
		t.Errorf("no lagging warning in the log")
	}
	// The counters move.
	wait.Until(t, "the published counter to move", func() bool {
		return scrape(t, addr)[`txoutbox_events_published_total{event_type="order.created"}`] > first[`txoutbox_events_published_total{event_type="order.created"}`]
	})

	// Stop it mid-run: 250ms per batch of 10 leaves most of the 60 pending.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, cmd, 30*time.Second); code != 0 {
		t.Fatalf("relay exited %d after SIGTERM:\n%s", code, stderr.String())
	}
	var stopped struct {
		Msg                 string
		Published, Released int64
	}
	sc := bufio.NewScanner(strings.NewReader(stderr.String()))
	for sc.Scan() {
		var l struct {
			Msg                 string
			Published, Released int64
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "txoutbox: relay stopped" {
			stopped = l
		}
	}
	if stopped.Msg == "" {
		t.Fatalf("no 'relay stopped' log:\n%s", stderr.String())
	}
	if stopped.Released != 0 {
		t.Fatalf("shutdown cut a batch off (%d released); it should have finished", stopped.Released)
	}

	printed := sinkIDs(t, stdout.String())
	published := f.count(t, "published_at IS NOT NULL")
	if len(printed) != published || int64(published) != stopped.Published {
		t.Fatalf("printed %d events, %d marked published, relay counted %d", len(printed), published, stopped.Published)
	}
	if published == 0 || published >= total {
		t.Fatalf("%d of %d published before SIGTERM: the test did not stop the relay mid-run", published, total)
	}
	if n := f.count(t, "published_at IS NOT NULL AND attempt_count <> 1"); n != 0 {
		t.Fatalf("%d events marked more than once", n)
	}

	// The next relay publishes exactly the rest.
	r := ok(t, f.dsn, "relay", "--broker", "log://?fail_types=order.stuck", "--drain", "--http-addr", "", "--initial-backoff", "1h")
	seen := map[string]int{}
	for _, id := range append(printed, sinkIDs(t, r.stdout)...) {
		seen[id]++
	}
	for _, ev := range evs {
		if seen[ev.ID] != 1 {
			t.Fatalf("event %s published %d times over the two relays, want once", ev.ID, seen[ev.ID])
		}
	}
	if len(seen) != total {
		t.Fatalf("%d distinct events published, want %d", len(seen), total)
	}
}

// TestHealthzTurnsUnavailableWhenStopping checks /healthz in process: 503
// "starting" until the relay runs, 200 while the database answers, 503
// "stopping" once shutdown began, 503 "unavailable" without the database,
// and nothing but the status in the body, whose reasons go to the log.
func TestHealthzTurnsUnavailableWhenStopping(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	db, err := openDatabase(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var logs strings.Builder
	a := &app{stdout: io.Discard, stderr: io.Discard, log: slog.New(slog.NewTextHandler(&logs, nil))}
	var h health
	h.set("starting")
	srv, addr, err := a.serveHTTP("127.0.0.1:0", prometheus.NewRegistry(), db, &h)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if code, rep := healthz(t, addr); code != http.StatusServiceUnavailable || rep.Status != "starting" {
		t.Fatalf("healthz while starting: %d %+v", code, rep)
	}
	h.set("ok")
	if code, rep := healthz(t, addr); code != http.StatusOK || rep.Status != "ok" {
		t.Fatalf("healthz: %d %+v", code, rep)
	}
	livez := func() int {
		resp, err := http.Get("http://" + addr + "/livez")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	h.set("stopping")
	if code, rep := healthz(t, addr); code != http.StatusServiceUnavailable || rep.Status != "stopping" {
		t.Fatalf("healthz while stopping: %d %+v", code, rep)
	}
	h.set("ok")
	db.db.Close() // the database is gone
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || strings.TrimSpace(string(body)) != `{"status":"unavailable"}` {
		t.Fatalf("healthz without a database: %d %s, want 503 and the status alone", resp.StatusCode, body)
	}
	if !strings.Contains(logs.String(), "database is closed") {
		t.Errorf("the reason is not in the log:\n%s", logs.String())
	}
	if code := livez(); code != http.StatusOK {
		t.Fatalf("livez without a database: %d, want 200 (restarting cures nothing)", code)
	}
}

// TestSeveralRelays runs two relay processes with two workers each against
// one table: SKIP LOCKED claims must give every event to exactly one of them.
func TestSeveralRelays(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const total = 300
	evs := f.enqueue(t, "order.created", "1", total/2)
	evs = append(evs, f.enqueue(t, "order.paid", "2", total/2)...)
	args := []string{"--broker", "log://?delay=10ms", "--batch-size", "10", "--concurrency", "2", "--poll-interval", "50ms"}
	cmd1, out1, err1, _ := startRelay(t, f.dsn, args...)
	cmd2, out2, err2, _ := startRelay(t, f.dsn, args...)
	wait.Until(t, "every event published", func() bool {
		return f.count(t, "published_at IS NULL") == 0
	})
	for i, cmd := range []*exec.Cmd{cmd1, cmd2} {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := exitCode(t, cmd, 30*time.Second); code != 0 {
			t.Fatalf("relay %d exited %d:\n%s", i+1, code, []*logbuf.Buffer{err1, err2}[i].String())
		}
	}
	ids1, ids2 := sinkIDs(t, out1.String()), sinkIDs(t, out2.String())
	if len(ids1) == 0 || len(ids2) == 0 {
		t.Logf("one relay did all the work (%d / %d): possible, but the test then proves less", len(ids1), len(ids2))
	}
	seen := map[string]int{}
	for _, id := range append(ids1, ids2...) {
		seen[id]++
	}
	for _, ev := range evs {
		if seen[ev.ID] != 1 {
			t.Fatalf("event %s published %d times by the two relays, want once", ev.ID, seen[ev.ID])
		}
	}
	if len(seen) != total || f.count(t, "attempt_count <> 1") != 0 {
		t.Fatalf("%d distinct published; %d events with attempt_count != 1", len(seen), f.count(t, "attempt_count <> 1"))
	}
}

// TestOrderedRelays runs two relays in ordered mode while every other event
// fails its first attempt: each aggregate's events must still reach the
// broker in the order they were written, whichever relay sends them.
func TestOrderedRelays(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // the default migration: ordered mode needs nothing more
	const aggs, perAgg = 6, 10
	var all []core.Event
	for i := range perAgg {
		for a := range aggs {
			typ := "order.ok"
			if i%2 == 0 {
				typ = "order.flaky"
			}
			all = append(all, f.enqueue(t, typ, strconv.Itoa(a), 1)...)
		}
	}
	args := []string{"--broker", "log://?fail_once_types=order.flaky", "--ordering", "on", "--ordered-partitions", "4",
		"--initial-backoff", "30ms", "--max-backoff", "60ms", "--poll-interval", "20ms", "--batch-size", "8"}
	cmd1, out1, err1, addr1 := startRelay(t, f.dsn, args...)
	cmd2, out2, err2, addr2 := startRelay(t, f.dsn, args...)
	wait.Until(t, "every event published", func() bool {
		return f.count(t, "published_at IS NULL") == 0
	})
	// The two relays share the four partitions.
	wait.Until(t, "the partitions shared 2+2", func() bool {
		m1, m2 := scrape(t, addr1), scrape(t, addr2)
		return m1["txoutbox_partitions"] == 4 && m1["txoutbox_partitions_held"] == 2 && m2["txoutbox_partitions_held"] == 2
	})
	for i, cmd := range []*exec.Cmd{cmd1, cmd2} {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := exitCode(t, cmd, 30*time.Second); code != 0 {
			t.Fatalf("relay %d exited %d:\n%s", i+1, code, []*logbuf.Buffer{err1, err2}[i].String())
		}
	}
	if !strings.Contains(err1.String(), `"ordered":true`) {
		t.Fatalf("relay did not start in ordered mode:\n%s", err1.String())
	}
	var lines []sinkLine
	for _, out := range []string{out1.String(), out2.String()} {
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			var l sinkLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, l)
		}
	}
	if len(lines) != len(all) {
		t.Fatalf("%d events sent, want %d", len(lines), len(all))
	}
	slices.SortStableFunc(lines, func(a, b sinkLine) int { return a.SentAt.Compare(b.SentAt) })
	last := map[string]int64{}
	for _, l := range lines {
		if l.Seq <= last[l.AggregateID] {
			t.Fatalf("aggregate %s: seq %d sent after %d", l.AggregateID, l.Seq, last[l.AggregateID])
		}
		last[l.AggregateID] = l.Seq
	}
	if n := f.count(t, "event_type = 'order.flaky' AND attempt_count <> 2"); n != 0 {
		t.Fatalf("%d flaky events not published on their second attempt", n)
	}

	// A draining relay in ordered mode (no leases of its own) publishes too.
	more := f.enqueue(t, "order.ok", "0", 3)
	r := ok(t, f.dsn, "relay", "--broker", "log://", "--ordering", "on", "--ordered-partitions", "4", "--drain", "--http-addr", "")
	if got := sinkIDs(t, r.stdout); len(got) != len(more) || !strings.Contains(r.stderr, "ordered=true") {
		t.Fatalf("ordered drain published %d of %d:\n%s", len(got), len(more), r.stderr)
	}
}

// TestShutdownTimeoutReleasesTheBatch stops a relay whose broker hangs: after
// --shutdown-timeout the batch is given back unmarked, and the next relay
// publishes it.
func TestShutdownTimeoutReleasesTheBatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	evs := f.enqueue(t, "order.created", "1", 5)
	cmd, stdout, stderr, addr := startRelay(t, f.dsn, "--broker", "log://?delay=1h", "--shutdown-timeout", "200ms")
	wait.Until(t, "a batch in flight", func() bool {
		return scrape(t, addr)["txoutbox_batches_total"] == 1
	})
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, cmd, 30*time.Second); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), `"released":5`) || !strings.Contains(stderr.String(), "shutdown cut a batch off") {
		t.Fatalf("the batch was not released:\n%s", stderr.String())
	}
	if stdout.String() != "" || f.count(t, "published_at IS NULL AND attempt_count = 0") != len(evs) {
		t.Fatalf("a cut-off batch left a trace: stdout %q", stdout.String())
	}
	r := ok(t, f.dsn, "relay", "--broker", "log://", "--drain", "--http-addr", "")
	if got := sinkIDs(t, r.stdout); len(got) != len(evs) {
		t.Fatalf("the next relay published %d of %d", len(got), len(evs))
	}
}

// TestPublishTimeoutFailsAHungBatch: a broker that never answers no longer
// holds the batch; after --publish-timeout its events are failed, with the
// timeout named, and wait out their backoff.
func TestPublishTimeoutFailsAHungBatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	evs := f.enqueue(t, "order.created", "1", 5)
	r := ok(t, f.dsn, "relay", "--broker", "log://?delay=1h", "--publish-timeout", "200ms", "--initial-backoff", "1h", "--drain", "--http-addr", "")
	if r.stdout != "" {
		t.Fatalf("a timed-out batch was published: %q", r.stdout)
	}
	if n := f.count(t, "published_at IS NULL AND attempt_count = 1 AND last_error LIKE '%publish timed out after 200ms%' AND next_attempt_at > now()"); n != len(evs) {
		t.Fatalf("%d of %d events failed with the timeout and wait for their retry:\n%s", n, len(evs), r.stderr)
	}
	bad := run(t, "", nil, "relay", "--broker", "log://", "--publish-timeout", "-1s", "--dsn", f.dsn)
	if bad.code != exitUsage || !strings.Contains(bad.stderr, "--publish-timeout") {
		t.Fatalf("negative --publish-timeout: exit %d\n%s", bad.code, bad.stderr)
	}
}

// TestRelayDeleteOnPublish: with --delete-on-publish the relay deletes what
// the broker took and keeps what failed, with its error.
func TestRelayDeleteOnPublish(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	created := f.enqueue(t, "order.created", "a1", 3)
	f.enqueue(t, "order.paid", "a2", 2)
	r := ok(t, f.dsn, "relay", "--broker", "log://?fail_types=order.paid", "--max-attempts", "1", "--drain", "--http-addr", "", "--delete-on-publish")
	if got := sinkIDs(t, r.stdout); len(got) != 3 || got[0] != created[0].ID {
		t.Fatalf("published %v, want the 3 order.created events", got)
	}
	if n := f.count(t, "1=1"); n != 2 {
		t.Errorf("%d rows left, want the 2 failed order.paid events", n)
	}
	if n := f.count(t, "event_type = 'order.paid' AND dead_at IS NOT NULL AND last_error <> ''"); n != 2 {
		t.Errorf("%d dead order.paid rows with their error, want 2", n)
	}
}
