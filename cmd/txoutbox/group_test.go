package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/logrelay"
)

// relay --config relays every outbox of the file in one process; an
// outbox whose database is down holds up no other; SIGHUP picks up an
// outbox added to the file, and a broken file is refused while the
// outboxes run on.
func TestRelayConfigGroup(t *testing.T) {
	t.Parallel()
	a, b, c := newFixture(t), newFixture(t), newFixture(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "outboxes.yaml")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base := `outboxes:
  - name: tenant-a
    dsn: ` + a.dsn + `
    broker: log://
    poll_interval: 100ms
  - name: tenant-b
    dsn_env: TXOUTBOX_TEST_B_DSN
    broker: log://
    poll_interval: 100ms
    delete_on_publish: true
  - name: tenant-down
    dsn: postgres://nobody:secret@127.0.0.1:1/none?connect_timeout=1
    broker: log://
`
	write(base)
	cmd, stdout, stderr, addr := startRelayEnv(t, []string{"TXOUTBOX_TEST_B_DSN=" + b.dsn}, a.dsn, "--config", conf)
	want := len(a.enqueue(t, "order.created", "a", 5)) + len(b.enqueue(t, "order.created", "b", 5))
	wait.Until(t, "the events of both healthy outboxes", func() bool { return len(sinkIDs(t, stdout.String())) >= want })
	if !strings.Contains(stderr.String(), `"outbox":"tenant-down"`) || !strings.Contains(stderr.String(), "database does not answer") {
		t.Errorf("the outbox whose database is down was not named in the log:\n%s", stderr.String())
	}
	if strings.Contains(stderr.String(), "secret") {
		t.Error("the log shows a DSN's password")
	}
	// The sink prints an event when the broker has it; the counter grows
	// once the batch's outcome is recorded, a moment later.
	var body string
	lines := []string{`txoutbox_events_published_total{event_type="order.created",outbox="tenant-a"} 5`,
		`txoutbox_events_published_total{event_type="order.created",outbox="tenant-b"} 5`, `txoutbox_group_member_running{outbox="tenant-down"}`}
	_ = wait.Poll(t.Context(), "the counters on /metrics", func() (bool, any) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		missing := 0
		for _, line := range lines {
			if !strings.Contains(body, line) {
				missing++
			}
		}
		return missing == 0, missing
	})
	for _, line := range lines {
		if !strings.Contains(body, line) {
			t.Errorf("/metrics has no %s", line)
		}
	}
	// tenant-b deletes what it published; tenant-a marks it.
	if n := b.count(t, "1=1"); n != 0 {
		t.Errorf("tenant-b (delete_on_publish) kept %d rows, want none", n)
	}
	if n := a.count(t, "published_at IS NOT NULL"); n != 5 {
		t.Errorf("tenant-a marked %d events published, want 5", n)
	}
	// /healthz: the process is ready (it serves the healthy outboxes), and
	// says what each outbox's relay does.
	code, rep := healthz(t, addr)
	states := map[string]string{}
	for _, o := range rep.Outboxes {
		states[o.Name] = o.State
	}
	if code != http.StatusOK || rep.Status != "ok" || states["tenant-a"] != "ok" || states["tenant-b"] != "ok" || states["tenant-down"] != "waiting for its database" {
		t.Errorf("/healthz: %d %+v", code, rep)
	}

	// A new outbox, picked up on SIGHUP without a restart.
	write(base + `  - name: tenant-c
    dsn: ` + c.dsn + `
    broker: log://
    poll_interval: 100ms
`)
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "the reload", func() bool { return strings.Contains(stderr.String(), "relay group reloaded") })
	want += len(c.enqueue(t, "order.created", "c", 3))
	wait.Until(t, "the new outbox's events", func() bool { return len(sinkIDs(t, stdout.String())) >= want })

	// A broken file is refused; the outboxes run on.
	write("outboxes:\n  - name: tenant-a\n    dsn: " + a.dsn + "\n    broker: log://\n    batch_sise: 10\n")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "the refused reload", func() bool {
		return strings.Contains(stderr.String(), "reload refused") && strings.Contains(stderr.String(), "batch_sise")
	})
	want += len(c.enqueue(t, "order.created", "c", 2))
	wait.Until(t, "events after the refused reload", func() bool { return len(sinkIDs(t, stdout.String())) >= want })

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, cmd, 30*time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	if got := len(sinkIDs(t, stdout.String())); got != want {
		t.Errorf("published %d events, want %d (each once)", got, want)
	}
}

// A --config file is checked whole before anything connects; each error
// names the outbox and the field.
func TestRelayConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, tc := range map[string]struct{ file, want string }{
		"empty":       {"outboxes: []\n", "lists no outboxes"},
		"unknown key": {"outboxes:\n  - name: a\n    dsn: postgres://h/db\n    broker: log://\n    brokr: x\n", "brokr"},
		"no name":     {"outboxes:\n  - dsn: postgres://h/db\n    broker: log://\n", "no name"},
		"twice":       {"outboxes:\n  - {name: a, dsn: 'postgres://h/db', broker: 'log://'}\n  - {name: a, dsn: 'postgres://h/db', broker: 'log://'}\n", `outbox "a": the name is used twice`},
		"both dsns":   {"outboxes:\n  - {name: a, dsn: 'postgres://h/db', dsn_env: X, broker: 'log://'}\n", "both dsn and dsn_env"},
		"env unset":   {"outboxes:\n  - {name: a, dsn_env: TXOUTBOX_TEST_UNSET_DSN, broker: 'log://'}\n", "TXOUTBOX_TEST_UNSET_DSN is not set"},
		"bad broker":  {"outboxes:\n  - {name: a, dsn: 'postgres://h/db', broker: 'ftp://x'}\n", `outbox "a"`},
		"bad mode":    {"outboxes:\n  - {name: a, dsn: 'postgres://h/db', broker: 'log://', mode: stream}\n", `mode "stream": want table or log`},
		"log, sqlite": {"outboxes:\n  - {name: a, dsn: 'sqlite:x.db', broker: 'log://', mode: log}\n", "mode log needs PostgreSQL"},
		"slot, table": {"outboxes:\n  - {name: a, dsn: 'postgres://h/db', broker: 'log://', slot: s}\n", "add mode: log"},
		"one slot": {"outboxes:\n  - {name: a, dsn: 'postgres://h/db', broker: 'log://', mode: log}\n  - {name: b, dsn: 'postgres://h/db', table: b, broker: 'log://', mode: log}\n",
			`outboxes "a" and "b" are in log mode on one database with one slot`},
		"bad table":    {"outboxes:\n  - {name: a, dsn: 'postgres://h/db', broker: 'log://', table: 'x;drop'}\n", "table"},
		"batch size":   {"outboxes:\n  - {name: a, dsn: 'postgres://h/db', broker: 'log://', batch_size: 0}\n", "--batch-size 0"},
		"bad duration": {"outboxes:\n  - {name: a, dsn: 'postgres://h/db', broker: 'log://', poll_interval: soon}\n", "poll_interval"},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".yaml")
		if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		r := run(t, "", nil, "relay", "--config", path)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit %d naming %q", name, r.code, r.stderr, exitUsage, tc.want)
		}
	}
	r := run(t, "", nil, "relay", "--config", filepath.Join(dir, "empty.yaml"), "--broker", "log://")
	if r.code != exitUsage || !strings.Contains(r.stderr, "drop --broker") {
		t.Errorf("--config with --broker: exit %d, %q", r.code, r.stderr)
	}
}

// stats --config reads every outbox of a relay --config file under its
// name, the others still when one's database is down, and --max-age names
// the lagging ones.
func TestStatsConfig(t *testing.T) {
	t.Parallel()
	a, b := newFixture(t), newFixture(t)
	a.enqueue(t, "order.created", "a", 3)
	a.exec(t, "UPDATE outbox_events SET created_at = now() - interval '10 minutes', next_attempt_at = now() - interval '10 minutes'")
	b.enqueue(t, "order.paid", "b", 2)
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// The brokers are the relay's business: stats needs neither them nor
	// the variables that hold them.
	healthy := `outboxes:
  - name: tenant-a
    dsn: ` + a.dsn + `
    broker_env: TXOUTBOX_TEST_UNSET_BROKER
  - name: tenant-b
    dsn_env: TXOUTBOX_TEST_B_DSN
    broker: log://
`
	conf := write("healthy.yaml", healthy)
	env := []string{"TXOUTBOX_TEST_B_DSN=" + b.dsn}

	r := run(t, "", env, "stats", "--config", conf)
	if r.code != 0 {
		t.Fatalf("stats --config: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	blocks := strings.Split(strings.TrimSpace(r.stdout), "\n\n")
	if len(blocks) != 2 || !strings.HasPrefix(blocks[0], "OUTBOX tenant-a (table outbox_events)\n") || !strings.HasPrefix(blocks[1], "OUTBOX tenant-b (table outbox_events)\n") {
		t.Fatalf("stats --config, table:\n%s", r.stdout)
	}
	for i, want := range []string{"TOTAL 3 10m", "TOTAL 2"} {
		var total string
		for _, line := range strings.Split(blocks[i], "\n") {
			if strings.HasPrefix(line, "TOTAL") {
				total = strings.Join(strings.Fields(line), " ")
			}
		}
		if !strings.HasPrefix(total, want) {
			t.Errorf("outbox %d: total line %q, want it to begin %q", i+1, total, want)
		}
	}

	r = run(t, "", env, "stats", "--config", conf, "--max-age", "5m")
	if r.code != exitLagging || !strings.Contains(r.stderr, "lagging: tenant-a (--max-age 5m0s)") {
		t.Fatalf("stats --config --max-age 5m with tenant-a's events 10m old: exit %d\n%s", r.code, r.stderr)
	}
	if r := run(t, "", env, "stats", "--config", conf, "--max-age", "1h"); r.code != 0 {
		t.Fatalf("stats --config --max-age 1h: exit %d\n%s", r.code, r.stderr)
	}

	// One database down: reported under its name, the others still read,
	// and the exit status says something failed.
	down := write("down.yaml", healthy+`  - name: tenant-down
    dsn: postgres://nobody:secret@127.0.0.1:1/none?connect_timeout=1
    broker: log://
`)
	r = run(t, "", env, "stats", "--config", down, "--format", "json")
	if r.code != exitError || !strings.Contains(r.stderr, "1 of 3 outboxes could not be read: tenant-down") {
		t.Fatalf("stats --config with a database down: exit %d\n%s", r.code, r.stderr)
	}
	if strings.Contains(r.stdout+r.stderr, "secret") {
		t.Errorf("stats --config printed a DSN's password:\n%s%s", r.stdout, r.stderr)
	}
	var got struct {
		Outboxes []struct {
			Name    string                   `json:"name"`
			Error   string                   `json:"error"`
			Pending *int64                   `json:"pending"`
			ByType  map[string]typeStatsJSON `json:"by_type"`
		} `json:"outboxes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	o := got.Outboxes
	if len(o) != 3 || o[0].Name != "tenant-a" || o[0].Pending == nil || *o[0].Pending != 3 || o[0].ByType["order.created"].Pending != 3 ||
		o[1].Name != "tenant-b" || o[1].Pending == nil || *o[1].Pending != 2 || o[1].Error != "" ||
		o[2].Name != "tenant-down" || !strings.Contains(o[2].Error, "connect to") || o[2].Pending != nil {
		t.Fatalf("stats --config --format json:\n%s", r.stdout)
	}

	// A file that names no DSN is refused before anything connects.
	bad := write("bad.yaml", "outboxes:\n  - name: nodsn\n    broker: log://\n")
	if r := run(t, "", nil, "stats", "--config", bad); r.code != exitUsage || !strings.Contains(r.stderr, `outbox "nodsn": no dsn`) {
		t.Fatalf("stats --config with an outbox without a DSN: exit %d\n%s", r.code, r.stderr)
	}
}

// A --config file mixes modes: an outbox streamed from its PostgreSQL
// slot, one from its MySQL stream, one claimed from its table, in one
// process, each stream's metrics under its outbox's name.
func TestRelayConfigLogMode(t *testing.T) {
	t.Parallel()
	suffix := testenv.RandomSuffix()
	pgDSN := testenv.PostgresDSN(t)
	slot := "grp_" + suffix
	t.Cleanup(func() { // before the database is dropped
		_ = logrelay.Teardown(context.Background(), pgDSN, logrelay.Names{Slot: slot, Publication: slot}, logrelay.TeardownOptions{Force: true})
	})
	ok(t, pgDSN, "migrate", "--mode", "log", "--slot", slot, "--publication", slot)
	pgLog := openFixture(t, "pgx", pgDSN, pgDSN)

	driverDSN, myDSN := mysqlDSNs(t)
	stream := "grp_" + suffix
	ok(t, myDSN, "migrate", "--mode", "log", "--stream", stream)
	myLog := openFixture(t, "mysql", driverDSN, myDSN)

	table := newFixture(t)
	conf := filepath.Join(t.TempDir(), "outboxes.yaml")
	if err := os.WriteFile(conf, []byte(`outboxes:
  - name: pg-log
    dsn: `+pgDSN+`
    broker: log://
    mode: log
    slot: `+slot+`
    publication: `+slot+`
  - name: my-log
    dsn: `+myDSN+`
    broker: log://
    mode: log
    stream: `+stream+`
  - name: pg-table
    dsn: `+table.dsn+`
    broker: log://
    poll_interval: 100ms
`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stdout, stderr, addr := startRelayEnv(t, nil, table.dsn, "--config", conf, "--stats-interval", "100ms")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the relay's log:\n%s", stderr.String())
		}
	})
	evs := append(append(pgLog.enqueue(t, "order.created", "a", 10), myLog.enqueue(t, "order.created", "b", 10)...), table.enqueue(t, "order.created", "c", 10)...)
	wait.Until(t, "the events of the three outboxes", func() bool { return len(sinkIDs(t, stdout.String())) >= len(evs) })
	got := idSet(nil)
	for _, id := range sinkIDs(t, stdout.String()) {
		got[id] = true
	}
	for _, ev := range evs {
		if !got[ev.ID] {
			t.Fatalf("event %s (aggregate %s) not published\n%s", ev.ID, ev.AggregateID, stderr.String())
		}
	}
	if pgLog.count(t, "true") != 0 || myLog.count(t, "published_at IS NULL") != 0 {
		t.Error("a log-mode outbox's events went through its table")
	}
	wait.Until(t, "each stream's metrics under its outbox", func() bool {
		m := scrape(t, addr)
		return m[`txoutbox_log_streaming{outbox="pg-log"}`] == 1 && m[`txoutbox_log_published_total{outbox="pg-log"}`] == 10 &&
			m[`txoutbox_log_streaming{outbox="my-log"}`] == 1 && m[`txoutbox_log_published_total{outbox="my-log"}`] == 10
	})
}

// On MySQL/MariaDB a table-mode relay wakes from the binlog (--wake auto),
// alone and as an outbox of relay --config: with a poll interval of a
// minute, an event committed by another process arrives within seconds.
func TestRelayWakesFromTheBinlog(t *testing.T) {
	t.Parallel()
	for _, group := range []bool{false, true} {
		t.Run(map[bool]string{false: "relay", true: "relay --config"}[group], func(t *testing.T) {
			t.Parallel()
			driverDSN, dsn := mysqlDSNs(t)
			ok(t, dsn, "migrate")
			f := openFixture(t, "mysql", driverDSN, dsn)
			args := []string{"--broker", "log://", "--poll-interval", "1h"}
			if group {
				conf := filepath.Join(t.TempDir(), "outboxes.yaml")
				if err := os.WriteFile(conf, []byte("outboxes:\n  - name: my-table\n    dsn: "+dsn+"\n    broker: log://\n    poll_interval: 1h\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				args = []string{"--config", conf}
			}
			_, stdout, stderr, _ := startRelayEnv(t, nil, dsn, args...)
			// An event every half second until one arrives: the first
			// round's may come with the relay's first claim, at its start,
			// or with a wake-up once the watcher reads the binlog. The
			// relay polls once an hour, so an event of the second round
			// that arrives at all was woken by the binlog.
			arrive := func(round string) {
				t.Helper()
				var ids []string
				wait.Until(t, round+": an event at the relay's stdout", func() bool {
					ids = append(ids, f.enqueue(t, "order.created", round, 1)[0].ID)
					time.Sleep(500 * time.Millisecond)
					got := idSet(nil)
					for _, id := range sinkIDs(t, stdout.String()) {
						got[id] = true
					}
					for _, id := range ids {
						if got[id] {
							return true
						}
					}
					return false
				})
			}
			arrive("start")
			// The claims that follow a batch are over: the relay is idle
			// until the next poll or a wake-up.
			time.Sleep(2 * time.Second)
			arrive("woken")
			if strings.Contains(stderr.String(), "no binlog wake-up") {
				t.Errorf("the relay polls instead:\n%s", stderr.String())
			}
		})
	}
}

// relay --config --max-connections caps the process's connections, shared
// by the file's databases: an outbox draining with 8 workers holds no
// more than its database's share.
func TestRelayConfigMaxConnections(t *testing.T) {
	t.Parallel()
	a, b := newFixture(t), newFixture(t)
	const backlog = 5000
	a.exec(t, `INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(), 'order', 'o-' || g, 'order.created', '{"n": 1}' FROM generate_series(1, 5000) g`)
	conf := filepath.Join(t.TempDir(), "outboxes.yaml")
	if err := os.WriteFile(conf, []byte(`outboxes:
  - name: busy
    dsn: `+a.dsn+`&application_name=grp_busy
    broker: log://
    concurrency: 8
    batch_size: 50
  - name: quiet
    dsn: `+b.dsn+`
    broker: log://
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := run(t, "", nil, "relay", "--dsn", a.dsn, "--broker", "log://", "--max-connections", "4"); r.code != exitUsage || !strings.Contains(r.stderr, "--max-connections 4: a positive cap with --config") {
		t.Fatalf("--max-connections without --config: exit %d\n%s", r.code, r.stderr)
	}
	_, stdout, stderr, _ := startRelayEnv(t, nil, a.dsn, "--config", conf, "--max-connections", "4")
	// The relay's connections to the busy outbox's database (its DSN names
	// them), at most, while it drains.
	most := 0
	wait.Until(t, "the backlog drained", func() bool {
		var n int
		if err := a.db.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'grp_busy'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		most = max(most, n)
		return stdout.Lines() >= backlog
	})
	t.Logf("at most %d connections to the busy outbox's database while it drained with 8 workers", most)
	if most > 2 || most == 0 {
		t.Errorf("the busy outbox's database had up to %d of the relay's connections, want 1-2 (4 for 2 databases)", most)
	}
	if !strings.Contains(stderr.String(), `"per_database":2`) {
		t.Errorf("the relay did not log the cap:\n%s", stderr.String())
	}
}

// An outbox of relay --config in log mode publishes to Kafka with
// ?transactional=true (its transactional ID named after its slot): a
// read_committed reader gets every event once. A table-mode outbox with
// the same URL is refused before anything runs.
func TestRelayConfigKafkaTransactional(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	broker := "kafka://" + strings.Join(c.ListenAddrs(), ",") + "?transactional=true"

	table := newFixture(t)
	refused := filepath.Join(t.TempDir(), "refused.yaml")
	if err := os.WriteFile(refused, []byte("outboxes:\n  - name: t\n    dsn: "+table.dsn+"\n    broker: '"+broker+"'\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, refusedLog, _ := startRelayEnv(t, nil, table.dsn, "--config", refused)
	wait.Until(t, "the table-mode outbox's broker refused for ?transactional=true", func() bool {
		return strings.Contains(refusedLog.String(), "needs a relay in log mode")
	})

	pgDSN := testenv.PostgresDSN(t)
	slot := "grptx_" + testenv.RandomSuffix()
	t.Cleanup(func() { // before the database is dropped
		_ = logrelay.Teardown(context.Background(), pgDSN, logrelay.Names{Slot: slot, Publication: slot}, logrelay.TeardownOptions{Force: true})
	})
	ok(t, pgDSN, "migrate", "--mode", "log", "--slot", slot, "--publication", slot)
	pgLog := openFixture(t, "pgx", pgDSN, pgDSN)
	conf := filepath.Join(t.TempDir(), "outboxes.yaml")
	if err := os.WriteFile(conf, []byte("outboxes:\n  - name: pg-log\n    dsn: "+pgDSN+"\n    broker: '"+broker+"'\n    mode: log\n    slot: "+slot+"\n    publication: "+slot+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, stderr, _ := startRelayEnv(t, nil, pgDSN, "--config", conf)
	eventType := "cli.kafka.tx." + testenv.RandomSuffix()
	evs := pgLog.enqueue(t, eventType, "a", 10)
	cons, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(eventType), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	got := map[string]int{}
	wait.For(t, "the outbox's events, committed, at a read_committed reader", func() (bool, any) {
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		for _, r := range cons.PollFetches(ctx).Records() {
			for _, h := range r.Headers {
				if h.Key == core.HeaderEventID {
					got[string(h.Value)]++
				}
			}
		}
		return len(got) >= len(evs), len(got)
	})
	for _, ev := range evs {
		if got[ev.ID] != 1 {
			t.Errorf("event %s read %d times, want once\n%s", ev.ID, got[ev.ID], stderr.String())
		}
	}
	// Published in transactions with the slot's position, under its ID.
	pos, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("txoutbox-positions"), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer pos.Close()
	wait.Until(t, "a position record keyed txoutbox-"+slot, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		for _, r := range pos.PollFetches(ctx).Records() {
			if string(r.Key) == "txoutbox-"+slot {
				return true
			}
		}
		return false
	})
}
