package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/internal/testkit/logbuf"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// txoutbox console serves the console of the outbox of --dsn, and refuses
// to listen beyond loopback without authentication.
func TestConsoleCommand(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enqueue(t, "order.created", "o-1", 3)
	if r := run(t, "", nil, "console", "--dsn", f.dsn, "--addr", ":0"); r.code != exitUsage || !strings.Contains(r.stderr, "beyond loopback") {
		t.Errorf("console on all interfaces without auth: exit %d, %q", r.code, r.stderr)
	}
	if r := run(t, "", nil, "relay", "--dsn", f.dsn, "--broker", "log://", "--console-addr", "0.0.0.0:0"); r.code != exitUsage || !strings.Contains(r.stderr, "beyond loopback") {
		t.Errorf("relay --console-addr on all interfaces without auth: exit %d, %q", r.code, r.stderr)
	}
	addr, stderr := startConsole(t, f.dsn, "--console-title", "orders")
	resp, err := http.Get(addr)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "txoutbox · orders") || !strings.Contains(string(body), `id="pending">3<`) {
		t.Errorf("GET %s: %d\n%s", addr, resp.StatusCode, body)
	}
	if strings.Contains(string(body), f.dsn) || strings.Contains(stderr.String(), "password") {
		t.Error("the console shows the DSN")
	}
}

// startConsole starts "txoutbox console" on dsn and a free loopback port,
// and returns its URL (from its log) and its log; the test's end kills it.
func startConsole(t *testing.T, dsn string, args ...string) (string, *logbuf.Buffer) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"console", "--dsn", dsn, "--addr", "127.0.0.1:0", "--log-format", "json"}, args...)...)
	cmd.Env = cliEnv()
	stderr := &logbuf.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	var addr string
	wait.Until(t, "the console's address in its log", func() bool {
		sc := bufio.NewScanner(strings.NewReader(stderr.String()))
		for sc.Scan() {
			var l struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "txoutbox: console: serving" {
				addr = l.Addr
				return true
			}
		}
		return false
	})
	return addr, stderr
}

// console --config serves the console of every outbox of a relay --config
// file under its name, an index of them behind the consoles' token, and
// one whose database is down holds up no other.
func TestConsoleConfig(t *testing.T) {
	t.Parallel()
	a, b := newFixture(t), newFixture(t)
	a.enqueue(t, "order.created", "a", 3)
	b.enqueue(t, "order.created", "b", 5)
	conf := filepath.Join(t.TempDir(), "outboxes.yaml")
	if err := os.WriteFile(conf, []byte(`outboxes:
  - name: tenant-a
    dsn: `+a.dsn+`
    broker: log://
  - name: tenant b
    dsn: `+b.dsn+`
    broker: log://
  - name: tenant-down
    dsn: postgres://nobody:secret@127.0.0.1:1/none?connect_timeout=1
    broker: log://
`), 0o600); err != nil {
		t.Fatal(err)
	}
	const token = "t0ken-for-the-test"
	addr, stderr := startConsole(t, a.dsn, "--config", conf, "--console-token", token)
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Jar: jar}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := client.Get(addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get(""); code != http.StatusUnauthorized {
		t.Errorf("the index without the token: %d, want 401", code)
	}
	code, index := get("?token=" + token)
	if code != http.StatusOK || !strings.Contains(index, `<a href="/tenant-a/">tenant-a</a>`) || !strings.Contains(index, `<a href="/tenant%20b/">tenant b</a>`) ||
		!strings.Contains(index, `<a href="/tenant-down/">tenant-down</a>`) {
		t.Fatalf("GET / with the token: %d\n%s", code, index)
	}
	for path, want := range map[string]string{"tenant-a/": `id="pending">3<`, "tenant%20b/": `id="pending">5<`} {
		code, body := get(path)
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("GET /%s: %d, want %s in\n%s", path, code, want, body)
		}
	}
	if code, _ := get("tenant-down/"); code == http.StatusOK {
		t.Error("the console of the outbox whose database is down answered 200")
	}
	if code, _ := get("tenant-a/"); code != http.StatusOK {
		t.Errorf("GET /tenant-a/ after the down outbox's page: %d", code)
	}
	if strings.Contains(stderr.String(), "secret") {
		t.Error("the console's log shows a DSN's password")
	}
}
