package main

// The tests build the txoutbox binary once and run it as an operator would,
// against a fresh PostgreSQL database per test, checking what it prints and
// what it left in the database.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/mysqldsn"
	"github.com/txoutbox/txoutbox/internal/testkit/logbuf"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

var binary string // the txoutbox binary, built by TestMain

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "txoutbox-cli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "txoutbox")
	build := exec.Command("go", "build", "-race", "-ldflags=-s -w", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build txoutbox:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result is what one run of the binary did.
type result struct {
	stdout, stderr string
	code           int
}

// cliEnv is the environment of the binary: the test's, without TXOUTBOX_*
// variables that would set flags behind the test's back.
func cliEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// run runs the binary with args, stdin and extra environment variables.
func run(t *testing.T, stdin string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = cliEnv(env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("run txoutbox %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// ok runs the binary with --dsn and fails the test unless it exits 0.
func ok(t *testing.T, dsn string, args ...string) result {
	t.Helper()
	r := run(t, "", nil, append(args, "--dsn", dsn)...)
	if r.code != 0 {
		t.Fatalf("txoutbox %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, r.code, r.stdout, r.stderr)
	}
	return r
}

// fixture is a migrated, empty outbox on a fresh PostgreSQL database.
type fixture struct {
	dsn string
	db  *sql.DB
	ob  *sqlxoutbox.Outbox
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	ok(t, dsn, "migrate")
	return openFixture(t, "pgx", dsn, dsn)
}

// enqueue commits n events of eventType for aggregate agg, as a producer
// would, and returns them with their IDs and Seqs.
func (f *fixture) enqueue(t *testing.T, eventType, agg string, n int) []core.Event {
	t.Helper()
	evs := make([]core.Event, n)
	for i := range evs {
		var err error
		evs[i], err = core.NewEvent("order", agg, eventType, map[string]int{"n": i})
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.ob.Enqueue(ctx, tx, evs...); err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return evs
}

// count runs a count(*) over the outbox table with a WHERE clause.
func (f *fixture) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.QueryRow("SELECT count(*) FROM outbox_events WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *fixture) exec(t *testing.T, query string, args ...any) {
	t.Helper()
	if _, err := f.db.Exec(query, args...); err != nil {
		t.Fatal(err)
	}
}

// sinkIDs parses the JSON lines of a log:// sink and returns the event IDs
// in order.
func sinkIDs(t *testing.T, out string) []string {
	t.Helper()
	var ids []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var l sinkLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("sink line %q: %v", sc.Text(), err)
		}
		if l.Headers[core.HeaderEventID] != l.EventID {
			t.Fatalf("sink line without the event_id header: %s", sc.Text())
		}
		ids = append(ids, l.EventID)
	}
	return ids
}

// mysqlDSNs makes a fresh MariaDB database and returns its DSN in the
// driver's form and in the CLI's mysql:// form.
func mysqlDSNs(t *testing.T) (driverDSN, cliDSN string) {
	t.Helper()
	driverDSN = testenv.MySQLDSN(t)
	cfg, err := mysqldsn.Config(driverDSN)
	if err != nil {
		t.Fatal(err)
	}
	return driverDSN, "mysql://" + url.UserPassword(cfg.User, cfg.Passwd).String() + "@" + cfg.Addr + "/" + cfg.DBName
}

// openFixture is the fixture of a migrated outbox: the driver and its
// DSN to write through, and the CLI's DSN of the same database.
func openFixture(t *testing.T, driver, driverDSN, cliDSN string) *fixture {
	t.Helper()
	db, err := sql.Open(driver, driverDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ob, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{dsn: cliDSN, db: db, ob: ob}
}

func idSet(evs []core.Event) map[string]bool {
	m := make(map[string]bool, len(evs))
	for _, ev := range evs {
		m[ev.ID] = true
	}
	return m
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	// The DSN from the environment, as in a container.
	r := run(t, "", []string{"TXOUTBOX_DSN=" + dsn}, "migrate")
	if r.code != 0 || !strings.Contains(r.stdout, "outbox table outbox_events, inbox table processed_events") {
		t.Fatalf("migrate: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Idempotent; and the flag wins over the environment.
	r = run(t, "", []string{"TXOUTBOX_DSN=postgres://nobody@127.0.0.1:1/nothing"}, "migrate", "--dsn", dsn)
	if r.code != 0 {
		t.Fatalf("migrate with --dsn over a bad TXOUTBOX_DSN: exit %d\n%s", r.code, r.stderr)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, table := range []string{"outbox_events", "processed_events", "txoutbox_migrations"} {
		var exists bool
		if err := db.QueryRow("SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil || !exists {
			t.Errorf("table %s after migrate: exists %v, err %v", table, exists, err)
		}
	}
	// A second outbox table, producer-only.
	ok(t, dsn, "migrate", "--table", "billing_outbox", "--skip-inbox")
	var exists bool
	if err := db.QueryRow("SELECT to_regclass('billing_outbox') IS NOT NULL").Scan(&exists); err != nil || !exists {
		t.Fatalf("billing_outbox: %v %v", exists, err)
	}

	// --print needs no database.
	r = run(t, "", nil, "migrate", "--print", "--dialect", "sqlite")
	if r.code != 0 || !strings.Contains(r.stdout, `CREATE TABLE IF NOT EXISTS "outbox_events"`) {
		t.Fatalf("migrate --print: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func TestSQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "app.db")
	dsn := "sqlite:" + path
	ok(t, dsn, "migrate")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cliFlow(t, "SQLite", db, dsn, dsn)
}

// The CLI on MariaDB, from a mysql:// URL and from the driver's own DSN:
// migrate, stats, relay (with several workers), dead letters, replay and
// cleanup.
func TestMySQL(t *testing.T) {
	t.Parallel()
	driverDSN, urlDSN := mysqlDSNs(t)
	ok(t, urlDSN, "migrate")
	ok(t, driverDSN, "migrate") // idempotent, either form
	db, err := sql.Open("mysql", driverDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cliFlow(t, "MariaDB", db, urlDSN, driverDSN)
	// A database that was never migrated stops at once, naming the fix.
	r := run(t, "", nil, "stats", "--dsn", testenv.MySQLDSN(t))
	if r.code == 0 || !strings.Contains(r.stderr, "run 'txoutbox migrate'") {
		t.Fatalf("stats on an empty MariaDB database: exit %d\n%s", r.code, r.stderr)
	}
}

// cliFlow runs the operators' commands on db's migrated outbox, reached as
// dsn (and as relayDSN by the first relay): stats, a relay with several
// workers and a failing event type, dead list and retry, replay, a second
// relay, cleanup.
func cliFlow(t *testing.T, name string, db *sql.DB, dsn, relayDSN string) {
	t.Helper()
	ob, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{dsn: dsn, db: db, ob: ob}
	evs := f.enqueue(t, "order.created", "1", 4)
	f.enqueue(t, "order.paid", "1", 1)

	r := ok(t, dsn, "stats", "--format", "json")
	var s statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil || s.Pending != 5 || s.ByType["order.created"].Pending != 4 {
		t.Fatalf("stats on %s: %v\n%s", name, err, r.stdout)
	}
	r = ok(t, relayDSN, "relay", "--broker", "log://?fail_types=order.paid", "--max-attempts", "1", "--drain", "--http-addr", "", "--concurrency", "4")
	if got := sinkIDs(t, r.stdout); len(got) != len(evs) {
		t.Fatalf("relay on %s published %d, want %d", name, len(got), len(evs))
	}
	r = ok(t, dsn, "dead", "list", "--format", "json")
	var dead []deadJSON
	if err := json.Unmarshal([]byte(r.stdout), &dead); err != nil || len(dead) != 1 || dead[0].EventType != "order.paid" {
		t.Fatalf("dead list on %s: %v\n%s", name, err, r.stdout)
	}
	ok(t, dsn, "dead", "retry", "--all")
	ok(t, dsn, "replay", "--type", "order.created")
	r = ok(t, dsn, "relay", "--broker", "log://", "--drain", "--http-addr", "")
	if got := sinkIDs(t, r.stdout); len(got) != len(evs)+1 {
		t.Fatalf("after retry and replay the relay on %s published %d, want %d", name, len(got), len(evs)+1)
	}
	r = ok(t, dsn, "cleanup", "--retention", "1ns")
	if !strings.Contains(r.stdout, "deleted 5 published event(s)") {
		t.Fatalf("cleanup on %s: %s", name, r.stdout)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no dsn", nil, []string{"stats"}, "TXOUTBOX_DSN"},
		{"bad log format", nil, []string{"stats", "--dsn", "postgres://x/y", "--log-format", "xml"}, "--log-format"},
		{"bad env value", []string{"TXOUTBOX_BATCH_SIZE=many"}, []string{"relay", "--dsn", "postgres://x/y"}, "TXOUTBOX_BATCH_SIZE"},
		{"unknown flag", nil, []string{"stats", "--colour"}, "unknown flag"},
		{"bad dsn", nil, []string{"stats", "--dsn", "oracle://x"}, "unsupported DSN"},
		{"bad mysql dsn", nil, []string{"stats", "--dsn", "mysql://x/db?parseTime=maybe"}, "MySQL DSN"},
		{"retry needs a selector", nil, []string{"dead", "retry", "--dsn", "postgres://x/y"}, "--all"},
		{"replay needs a selector", nil, []string{"replay", "--dsn", "postgres://x/y"}, "--all"},
		{"batch size too large", nil, []string{"relay", "--dsn", "postgres://x/y", "--broker", "log://", "--batch-size", "2000000000"}, "--batch-size"},
		{"negative backoff", nil, []string{"relay", "--dsn", "postgres://x/y", "--broker", "log://", "--initial-backoff", "-1s"}, "--initial-backoff"},
		{"negative max backoff", nil, []string{"relay", "--dsn", "postgres://x/y", "--broker", "log://", "--max-backoff", "-1s"}, "--max-backoff"},
		{"misspelt broker parameter", nil, []string{"relay", "--dsn", "postgres://x/y", "--broker", "amqp://localhost/?consumer=billing"}, "consumers"},
		{"broker without scheme", nil, []string{"relay", "--dsn", "postgres://x/y", "--broker", "localhost:5672"}, "not a URL"},
		{"invalid table", nil, []string{"migrate", "--dsn", "postgres://x/y", "--table", "bad;name"}, "bad;name"},
		{"cleanup batch too large", nil, []string{"cleanup", "--dsn", "postgres://x/y", "--batch-size", "2000000000"}, "--batch-size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, "", tc.env, tc.args...)
			if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("exit %d, want %d with %q in stderr:\n%s", r.code, exitUsage, tc.want, r.stderr)
			}
		})
	}
	r := run(t, "", nil, "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "txoutbox relay --broker log://") {
		t.Fatalf("--help does not teach: %s", r.stdout)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enqueue(t, "order.created", "1", 3)
	f.enqueue(t, "order.paid", "1", 2)
	// The order.created events have waited ten minutes.
	f.exec(t, "UPDATE outbox_events SET created_at = now() - interval '10 minutes', next_attempt_at = now() - interval '10 minutes' WHERE event_type = 'order.created'")
	f.exec(t, "UPDATE outbox_events SET dead_at = now(), last_error = 'x' WHERE id = (SELECT max(id) FROM outbox_events)")
	// A reminder scheduled for tomorrow is counted apart: it is not lag.
	f.enqueue(t, "order.reminder", "1", 1)
	f.exec(t, "UPDATE outbox_events SET next_attempt_at = now() + interval '1 day' WHERE event_type = 'order.reminder'")

	r := ok(t, f.dsn, "stats")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 5 {
		t.Fatalf("stats table:\n%s", r.stdout)
	}
	for i, want := range [][]string{
		{"EVENT", "TYPE", "PENDING", "OLDEST", "PENDING", "DEAD", "SCHEDULED"},
		{"order.created", "3", "10m0s", "0", "0"},
		{"order.paid", "1", "", "1", "0"},
		{"order.reminder", "0", "-", "0", "1"},
		{"TOTAL", "4", "10m0s", "1", "1"},
	} {
		got := strings.Fields(lines[i])
		switch i {
		case 1, 4:
			// Ten minutes, and the seconds the CLI took to start and
			// read them: more than one under load.
			if d, err := time.ParseDuration(got[2]); err == nil && d >= 10*time.Minute && d < 11*time.Minute {
				got[2] = "10m0s"
			}
		case 2:
			got = append(got[:2], "", got[3], got[4]) // the age of a fresh event varies
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("line %d: %q, want %q", i, lines[i], strings.Join(want, " "))
		}
	}

	r = ok(t, f.dsn, "stats", "--format", "json")
	var s statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if s.Pending != 4 || s.Dead != 1 || s.OldestPendingAgeSeconds < 599 || s.OldestPending == nil ||
		s.ByType["order.created"].Pending != 3 || s.ByType["order.paid"].Dead != 1 ||
		s.Scheduled != 1 || s.ByType["order.reminder"].Scheduled != 1 {
		t.Fatalf("stats json: %+v", s)
	}

	r = run(t, "", nil, "stats", "--dsn", f.dsn, "--max-age", "5m")
	if r.code != exitLagging || !strings.Contains(r.stderr, "lagging") {
		t.Fatalf("stats --max-age 5m with a 10m old event: exit %d\n%s", r.code, r.stderr)
	}
	ok(t, f.dsn, "stats", "--max-age", "1h")
}

// The relay drains everything, with its marks committed asynchronously (the
// default) and with --sync-mark.
func TestRelayDrainPublishesEverything(t *testing.T) {
	t.Parallel()
	for _, extra := range [][]string{nil, {"--sync-mark"}} {
		t.Run(fmt.Sprint(extra), func(t *testing.T) {
			f := newFixture(t)
			evs := append(f.enqueue(t, "order.created", "1", 120), f.enqueue(t, "order.paid", "2", 5)...)
			r := ok(t, f.dsn, append([]string{"relay", "--broker", "log://", "--drain", "--http-addr", "", "--batch-size", "50", "--log-format", "json"}, extra...)...)
			ids := sinkIDs(t, r.stdout)
			if len(ids) != len(evs) {
				t.Fatalf("sink printed %d events, want %d", len(ids), len(evs))
			}
			want := idSet(evs)
			for _, id := range ids {
				if !want[id] {
					t.Fatalf("sink printed unknown or duplicate event %s", id)
				}
				delete(want, id)
			}
			if n := f.count(t, "published_at IS NULL"); n != 0 {
				t.Fatalf("%d events unpublished after drain", n)
			}
			if !strings.Contains(r.stderr, `"msg":"txoutbox: relay drained"`) || !strings.Contains(r.stderr, `"published":125`) {
				t.Fatalf("no structured summary log:\n%s", r.stderr)
			}
		})
	}
}

func TestDeadListRetryPurge(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	paid := f.enqueue(t, "order.paid", "1", 3)
	f.enqueue(t, "order.created", "2", 2)
	r := ok(t, f.dsn, "relay", "--broker", "memory://?fail_types=order.paid", "--max-attempts", "1", "--drain", "--http-addr", "")
	if !strings.Contains(r.stderr, "dead-lettered") || !strings.Contains(r.stderr, paid[0].ID) {
		t.Fatalf("no dead-letter log with the event id:\n%s", r.stderr)
	}
	if n := f.count(t, "dead_at IS NOT NULL AND event_type = 'order.paid'"); n != 3 {
		t.Fatalf("%d dead order.paid events, want 3", n)
	}

	r = ok(t, f.dsn, "dead", "list")
	for _, ev := range paid {
		if !strings.Contains(r.stdout, ev.ID) {
			t.Fatalf("dead list lacks %s:\n%s", ev.ID, r.stdout)
		}
	}
	if !strings.Contains(r.stdout, "failure requested by fail_types") || strings.Count(r.stdout, "\n") != 4 {
		t.Fatalf("dead list table:\n%s", r.stdout)
	}
	r = ok(t, f.dsn, "dead", "list", "--format", "json", "--type", "order.paid", "--limit", "2")
	var listed []deadJSON
	if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed) != 2 {
		t.Fatalf("dead list json: %v\n%s", err, r.stdout)
	}
	if listed[0].ID != paid[0].ID || listed[0].Attempts != 1 || listed[0].DeadAt == nil || listed[0].LastError == "" {
		t.Fatalf("dead list json entry: %+v", listed[0])
	}
	if !strings.Contains(r.stderr, fmt.Sprintf("--after %d", listed[1].Seq)) {
		t.Fatalf("no paging hint: %s", r.stderr)
	}
	r = ok(t, f.dsn, "dead", "list", "--summary")
	if l := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(l) != 2 || !strings.HasPrefix(strings.Join(strings.Fields(l[1]), " "), "3 order.paid") {
		t.Fatalf("dead list --summary:\n%s", r.stdout)
	}
	r = ok(t, f.dsn, "dead", "list", "--type", "order.created")
	if !strings.Contains(r.stdout, "no dead-lettered events") {
		t.Fatalf("dead list of a type with none: %s", r.stdout)
	}

	// Retry one by ID: it is pending again with a fresh budget.
	r = ok(t, f.dsn, "dead", "retry", "--id", paid[0].ID)
	if !strings.Contains(r.stdout, "re-queued 1 dead event(s)") {
		t.Fatalf("retry: %s", r.stdout)
	}
	if n := f.count(t, "event_id = $1 AND dead_at IS NULL AND published_at IS NULL AND attempt_count = 0", paid[0].ID); n != 1 {
		t.Fatalf("retried event not pending with attempt_count 0")
	}
	// The relay publishes it now that the broker works.
	r = ok(t, f.dsn, "relay", "--broker", "log://", "--drain", "--http-addr", "")
	if ids := sinkIDs(t, r.stdout); len(ids) != 1 || ids[0] != paid[0].ID {
		t.Fatalf("after retry the relay published %v, want [%s]", ids, paid[0].ID)
	}

	// Purge asks; anything but yes keeps the events.
	for _, answer := range []string{"n\n", "", "maybe\n"} {
		r = run(t, answer, nil, "dead", "purge", "--type", "order.paid", "--dsn", f.dsn)
		if r.code != exitError || !strings.Contains(r.stderr, "Permanently delete 2 dead-lettered event(s) (type order.paid)?") ||
			!strings.Contains(r.stderr, "aborted") {
			t.Fatalf("purge answered %q: exit %d\n%s", answer, r.code, r.stderr)
		}
		if n := f.count(t, "dead_at IS NOT NULL"); n != 2 {
			t.Fatalf("purge answered %q deleted events: %d dead left", answer, n)
		}
	}
	r = run(t, "y\n", nil, "dead", "purge", "--seq", fmt.Sprint(paid[1].Seq), "--dsn", f.dsn)
	if r.code != 0 || !strings.Contains(r.stdout, "purged 1 dead event(s)") {
		t.Fatalf("purge confirmed: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = ok(t, f.dsn, "dead", "purge", "--all", "--yes")
	if !strings.Contains(r.stdout, "purged 1 dead event(s)") {
		t.Fatalf("purge --all --yes: %s", r.stdout)
	}
	if n := f.count(t, "dead_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d dead events after purge --all", n)
	}
	if n := f.count(t, "true"); n != 3 {
		t.Fatalf("purge touched live events: %d rows left, want 3", n)
	}
	// --yes is never read from the environment.
	f.enqueue(t, "order.paid", "3", 1)
	ok(t, f.dsn, "relay", "--broker", "memory://?fail_types=order.paid", "--max-attempts", "1", "--drain", "--http-addr", "")
	r = run(t, "", []string{"TXOUTBOX_YES=true", "TXOUTBOX_DSN=" + f.dsn}, "dead", "purge", "--all")
	if r.code != exitError || f.count(t, "dead_at IS NOT NULL") != 1 {
		t.Fatalf("TXOUTBOX_YES purged without asking: exit %d", r.code)
	}
	// Nor is a selector: without one on the command line, nothing happens.
	r = run(t, "", []string{"TXOUTBOX_TYPE=order.paid", "TXOUTBOX_DSN=" + f.dsn}, "dead", "retry")
	if r.code != exitUsage || f.count(t, "dead_at IS NOT NULL") != 1 {
		t.Fatalf("TXOUTBOX_TYPE selected events: exit %d\n%s", r.code, r.stderr)
	}
}

func TestReplay(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a1 := f.enqueue(t, "order.created", "a1", 2)
	a2 := f.enqueue(t, "order.paid", "a2", 3)
	ok(t, f.dsn, "relay", "--broker", "memory://", "--drain", "--http-addr", "")
	if n := f.count(t, "published_at IS NULL"); n != 0 {
		t.Fatalf("%d unpublished", n)
	}

	replay := func(want []core.Event, args ...string) {
		t.Helper()
		r := ok(t, f.dsn, append([]string{"replay"}, args...)...)
		if !strings.Contains(r.stdout, fmt.Sprintf("re-queued %d published event(s)", len(want))) {
			t.Fatalf("replay %v: %s", args, r.stdout)
		}
		r = ok(t, f.dsn, "relay", "--broker", "log://", "--drain", "--http-addr", "")
		got := sinkIDs(t, r.stdout)
		if len(got) != len(want) {
			t.Fatalf("replay %v republished %d events, want %d", args, len(got), len(want))
		}
		ws := idSet(want)
		for _, id := range got {
			if !ws[id] {
				t.Fatalf("replay %v republished %s, not selected", args, id)
			}
		}
	}
	replay(a1, "--aggregate-type", "order", "--aggregate-id", "a1")
	replay(a2, "--type", "order.paid")
	replay(append(a1[1:], a2[0]), "--from-seq", fmt.Sprint(a1[1].Seq), "--to-seq", fmt.Sprint(a2[0].Seq))
	replay(append(a1, a2...), "--since", "1h")
	replay(nil, "--until", "1h") // nothing is older than an hour
	r := run(t, "n\n", nil, "replay", "--all", "--dsn", f.dsn)
	if r.code != exitError || f.count(t, "published_at IS NULL") != 0 {
		t.Fatalf("replay --all without confirmation: exit %d", r.code)
	}
	replay(append(a1, a2...), "--all", "--yes")
}

func TestCleanupWithProgress(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enqueue(t, "order.created", "1", 7)
	f.enqueue(t, "order.created", "1", 1)
	ok(t, f.dsn, "relay", "--broker", "memory://", "--drain", "--http-addr", "")
	f.enqueue(t, "order.created", "1", 1) // pending, never deleted
	// Five of the published events are 40 days old; one pending one too.
	f.exec(t, `UPDATE outbox_events SET published_at = now() - interval '40 days'
		WHERE id IN (SELECT id FROM outbox_events WHERE published_at IS NOT NULL ORDER BY id LIMIT 5)`)
	f.exec(t, "UPDATE outbox_events SET created_at = now() - interval '40 days' WHERE published_at IS NULL")

	r := ok(t, f.dsn, "cleanup", "--batch-size", "2")
	if !strings.Contains(r.stdout, "deleted 5 published event(s) older than 720h0m0s") {
		t.Fatalf("cleanup: %s", r.stdout)
	}
	for _, want := range []string{"deleted 2 of 5 (40%) events", "deleted 4 of 5 (80%) events", "deleted 5 of 5 (100%) events"} {
		if !strings.Contains(r.stderr, want) {
			t.Fatalf("no progress line %q:\n%s", want, r.stderr)
		}
	}
	if n := f.count(t, "true"); n != 4 {
		t.Fatalf("%d rows left, want 3 recent published + 1 pending", n)
	}
	if n := f.count(t, "published_at IS NULL"); n != 1 {
		t.Fatalf("cleanup deleted a pending event")
	}
	r = ok(t, f.dsn, "cleanup", "--retention", "1ns", "--quiet")
	if !strings.Contains(r.stdout, "deleted 3 published") || strings.Contains(r.stderr, "deleted 3 events") {
		t.Fatalf("cleanup --retention 1ns --quiet: %s%s", r.stdout, r.stderr)
	}
}

// startRelay starts a long-running relay and returns it with its stdout and
// stderr, and the address of its HTTP server.
func startRelay(t *testing.T, dsn string, args ...string) (*exec.Cmd, *logbuf.Buffer, *logbuf.Buffer, string) {
	t.Helper()
	return startRelayEnv(t, nil, dsn, args...)
}

// startRelayEnv is startRelay with variables added to the environment.
func startRelayEnv(t *testing.T, env []string, dsn string, args ...string) (*exec.Cmd, *logbuf.Buffer, *logbuf.Buffer, string) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"relay", "--dsn", dsn, "--http-addr", "127.0.0.1:0", "--log-format", "json"}, args...)...)
	cmd.Env = cliEnv(env...)
	stdout, stderr := &logbuf.Buffer{}, &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	var addr string
	wait.Until(t, "the relay's HTTP address in its log", func() bool {
		sc := bufio.NewScanner(strings.NewReader(stderr.String()))
		for sc.Scan() {
			var l struct {
				Msg, Addr string
			}
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "txoutbox: serving /metrics and /healthz" {
				addr = l.Addr
				return true
			}
		}
		return false
	})

	return cmd, stdout, stderr, addr
}

// exitCode waits for cmd and returns its exit code, failing after d.
func exitCode(t *testing.T, cmd *exec.Cmd, d time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(d):
		_ = cmd.Process.Kill()
		t.Fatalf("relay did not exit within %s", d)
		return -1
	}
}

func TestPartitionedMigrateAndCleanup(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	r := ok(t, dsn, "migrate", "--partitioned", "--partitions-ahead", "3")
	if !strings.Contains(r.stdout, "migrated") {
		t.Fatalf("migrate --partitioned: %s", r.stdout)
	}
	ok(t, dsn, "migrate", "--partitioned", "--partitions-ahead", "3") // idempotent
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	partitions := func() int {
		var n int
		if err := db.QueryRow("SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox_events'::regclass").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := partitions(); n != 4 { // three days and the DEFAULT partition
		t.Fatalf("%d partitions after migrate --partitioned --partitions-ahead 3, want 4", n)
	}
	var inbox bool
	if err := db.QueryRow("SELECT to_regclass('processed_events') IS NOT NULL").Scan(&inbox); err != nil || !inbox {
		t.Fatalf("no inbox table next to the partitioned outbox: %v", err)
	}

	// An event of 40 days ago, published then, in its own day's partition.
	ob, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{dsn: dsn, db: db, ob: ob}
	old := time.Now().UTC().AddDate(0, 0, -40)
	if _, err := dialect.EnsurePartitions(context.Background(), db, dialect.Postgres, dialect.PartitionOptions{Ahead: 1, Logger: quiet}, old); err != nil {
		t.Fatal(err)
	}
	f.enqueue(t, "order.created", "1", 2)
	ok(t, dsn, "relay", "--broker", "memory://", "--drain", "--http-addr", "")
	f.exec(t, "UPDATE outbox_events SET created_at = $1, published_at = $1 WHERE id = (SELECT min(id) FROM outbox_events)", old)

	r = ok(t, dsn, "cleanup", "--partitioned", "--partitions-ahead", "3")
	if !strings.Contains(r.stdout, "deleted 1 published event(s)") {
		t.Fatalf("cleanup --partitioned: %s\n%s", r.stdout, r.stderr)
	}
	if n := f.count(t, "true"); n != 1 {
		t.Fatalf("%d events left, want the recent one", n)
	}
	if n := partitions(); n != 4 {
		t.Fatalf("%d partitions after cleanup, want the old one dropped (4 left)", n)
	}
}
