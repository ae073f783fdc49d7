package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/logbuf"
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
	waitFor(t, 30*time.Second, "the console's address in its log", func() bool {
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
