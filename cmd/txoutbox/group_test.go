package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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
  - name: tenant-down
    dsn: postgres://nobody:secret@127.0.0.1:1/none?connect_timeout=1
    broker: log://
`
	write(base)
	cmd, stdout, stderr, addr := startRelayEnv(t, []string{"TXOUTBOX_TEST_B_DSN=" + b.dsn}, a.dsn, "--config", conf)
	want := len(a.enqueue(t, "order.created", "a", 5)) + len(b.enqueue(t, "order.created", "b", 5))
	waitFor(t, 30*time.Second, "the events of both healthy outboxes", func() bool { return len(sinkIDs(t, stdout.String())) >= want })
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
	deadline := time.Now().Add(10 * time.Second)
	for {
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
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, line := range lines {
		if !strings.Contains(body, line) {
			t.Errorf("/metrics has no %s", line)
		}
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
	waitFor(t, 30*time.Second, "the reload", func() bool { return strings.Contains(stderr.String(), "relay group reloaded") })
	want += len(c.enqueue(t, "order.created", "c", 3))
	waitFor(t, 30*time.Second, "the new outbox's events", func() bool { return len(sinkIDs(t, stdout.String())) >= want })

	// A broken file is refused; the outboxes run on.
	write("outboxes:\n  - name: tenant-a\n    dsn: " + a.dsn + "\n    broker: log://\n    batch_sise: 10\n")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the refused reload", func() bool {
		return strings.Contains(stderr.String(), "reload refused") && strings.Contains(stderr.String(), "batch_sise")
	})
	want += len(c.enqueue(t, "order.created", "c", 2))
	waitFor(t, 30*time.Second, "events after the refused reload", func() bool { return len(sinkIDs(t, stdout.String())) >= want })

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
		"empty":        {"outboxes: []\n", "lists no outboxes"},
		"unknown key":  {"outboxes:\n  - name: a\n    dsn: postgres://h/db\n    broker: log://\n    brokr: x\n", "brokr"},
		"no name":      {"outboxes:\n  - dsn: postgres://h/db\n    broker: log://\n", "no name"},
		"twice":        {"outboxes:\n  - {name: a, dsn: 'postgres://h/db', broker: 'log://'}\n  - {name: a, dsn: 'postgres://h/db', broker: 'log://'}\n", `outbox "a": the name is used twice`},
		"both dsns":    {"outboxes:\n  - {name: a, dsn: 'postgres://h/db', dsn_env: X, broker: 'log://'}\n", "both dsn and dsn_env"},
		"env unset":    {"outboxes:\n  - {name: a, dsn_env: TXOUTBOX_TEST_UNSET_DSN, broker: 'log://'}\n", "TXOUTBOX_TEST_UNSET_DSN is not set"},
		"bad broker":   {"outboxes:\n  - {name: a, dsn: 'postgres://h/db', broker: 'ftp://x'}\n", `outbox "a"`},
		"log mode":     {"outboxes:\n  - {name: a, dsn: 'postgres://h/db', broker: 'log://', mode: log}\n", "relay process of its own"},
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
