package main

import (
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// planted is a password that must never be printed.
const planted = "Pl4nted-S3cret"

// Every failure path of the CLI, with a password planted in the DSN or the
// broker URL in every form an operator might write, at debug level: the
// password reaches neither stdout nor stderr (the logs).
func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dead := deadAddr(t)
	cases := []struct {
		name string
		env  []string
		args []string
	}{
		{"url dsn, unreachable", nil, []string{"stats", "--dsn", "postgres://app:" + planted + "@" + dead + "/db"}},
		{"url dsn in the environment", []string{"TXOUTBOX_DSN=postgres://app:" + planted + "@" + dead + "/db"}, []string{"stats"}},
		{"key/value dsn", nil, []string{"stats", "--dsn", "host=" + strings.Split(dead, ":")[0] + " port=" + strings.Split(dead, ":")[1] + " user=app password=" + planted + " dbname=x"}},
		{"key/value dsn, quoted", nil, []string{"stats", "--dsn", "host=127.0.0.1 port=" + strings.Split(dead, ":")[1] + " password='" + planted + " x' dbname=x"}},
		{"url dsn, bad escape", nil, []string{"stats", "--dsn", "postgres://app:" + planted + "%ZZ@" + dead + "/db"}},
		{"url dsn, space", nil, []string{"stats", "--dsn", "postgres://app:" + planted + " x@" + dead + "/db"}},
		{"migrate, unreachable", nil, []string{"migrate", "--dsn", "postgres://app:" + planted + "@" + dead + "/db"}},
		{"unsupported dsn", nil, []string{"stats", "--dsn", "oracle://app:" + planted + "@host/db"}},
		{"mysql url, unreachable", nil, []string{"stats", "--dsn", "mysql://app:" + planted + "@" + dead + "/db"}},
		{"mysql driver dsn, unreachable", nil, []string{"migrate", "--dsn", "app:" + planted + "@tcp(" + dead + ")/db"}},
		{"mysql url, bad parameter", nil, []string{"stats", "--dsn", "mysql://app:" + planted + "@" + dead + "/db?tls=nosuchconfig"}},
		{"mysql url, bad escape", nil, []string{"stats", "--dsn", "mysql://app:" + planted + "%ZZ@" + dead + "/db"}},
		{"broker, bad escape", nil, []string{"relay", "--dsn", f.dsn, "--fail-fast", "--http-addr", "", "--broker", "amqp://guest:" + planted + "%ZZ@" + dead + "/"}},
		{"broker, no scheme", nil, []string{"relay", "--dsn", f.dsn, "--fail-fast", "--http-addr", "", "--broker", "guest:" + planted + "@" + dead}},
		{"broker, unreachable", nil, []string{"relay", "--dsn", f.dsn, "--fail-fast", "--http-addr", "", "--broker", "amqp://guest:" + planted + "@" + dead + "/"}},
		{"broker, unknown parameter", nil, []string{"relay", "--dsn", f.dsn, "--fail-fast", "--http-addr", "", "--broker", "amqp://guest:" + planted + "@" + dead + "/?consumer=x"}},
		{"nats, unreachable", nil, []string{"relay", "--dsn", f.dsn, "--fail-fast", "--http-addr", "", "--broker", "nats://user:" + planted + "@" + dead + "?stream=S"}},
		{"nats, no stream", nil, []string{"relay", "--dsn", f.dsn, "--fail-fast", "--http-addr", "", "--broker", "nats://user:" + planted + "@" + dead}},
		{"kafka with credentials", nil, []string{"relay", "--dsn", f.dsn, "--fail-fast", "--http-addr", "", "--broker", "kafka://user:" + planted + "@" + dead}},
		{"broker in the environment", []string{"TXOUTBOX_BROKER=amqp://guest:" + url.QueryEscape(planted) + "@" + dead + "/"}, []string{"relay", "--dsn", f.dsn, "--fail-fast", "--http-addr", ""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := run(t, "", tc.env, append(tc.args, "--log-level", "debug")...)
			if r.code == 0 {
				t.Fatalf("exit 0, want a failure:\n%s", r.stderr)
			}
			for _, out := range []string{r.stdout, r.stderr} {
				if strings.Contains(out, planted) || strings.Contains(out, "S3cret") {
					t.Fatalf("the password was printed:\n%s", out)
				}
			}
			if !strings.Contains(r.stderr, "txoutbox: ") {
				t.Fatalf("no error message:\n%s", r.stderr)
			}
		})
	}
	if got := redact("amqp://guest:" + planted + "@host/ and host=db password='" + planted + "' user=x"); strings.Contains(got, planted) {
		t.Fatalf("redact: %s", got)
	}
}

// deadAddr returns a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// lateProxy returns an address where nothing listens until open is
// called, and which then forwards connections to target: a dependency
// that is down when the relay starts and comes up later.
func lateProxy(t *testing.T, target string) (addr string, open func()) {
	t.Helper()
	addr = deadAddr(t)
	var once sync.Once
	done := make(chan struct{})
	t.Cleanup(func() { once.Do(func() { close(done) }) })
	up := make(chan struct{})
	var opened sync.Once
	go func() {
		select {
		case <-done:
			return
		case <-up:
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("late proxy: %v", err)
			return
		}
		go func() { <-done; ln.Close() }()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c) }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return addr, func() { opened.Do(func() { close(up) }) }
}

// A relay started while the database and then the broker are down waits
// for them (one line each way, "starting" on /healthz), then works; with
// --fail-fast it exits at once.
func TestRelayWaitsForItsDependencies(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	evs := f.enqueue(t, "order.created", "1", 3)
	pg, err := url.Parse(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	amqpURL, err := url.Parse(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	dbAddr, openDB := lateProxy(t, pg.Host)
	brokerAddr, openBroker := lateProxy(t, amqpURL.Host)
	lateDSN := *pg
	lateDSN.Host = dbAddr
	lateBroker := *amqpURL
	lateBroker.Host = brokerAddr
	lateBroker.RawQuery = "consumers=late-" + testenv.RandomSuffix()

	cmd, _, stderr, addr := startRelay(t, lateDSN.String(), "--broker", lateBroker.String(), "--drain")
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("healthz while waiting for the database: %d, want 503", resp.StatusCode)
	}
	// Each dependency comes up once the relay has said it waits for it.
	wait.Until(t, "the relay to say the database does not answer", func() bool {
		return strings.Contains(stderr.String(), "database does not answer")
	})
	openDB()
	wait.Until(t, "the relay to say the broker does not answer", func() bool {
		return strings.Contains(stderr.String(), "broker does not answer")
	})
	openBroker()
	if code := exitCode(t, cmd, wait.Stall); code != 0 {
		t.Fatalf("relay exited %d after its dependencies came up:\n%s", code, stderr.String())
	}
	out := stderr.String()
	for _, want := range []string{"database does not answer", "database answers", "broker does not answer", "broker answers"} {
		if n := strings.Count(out, want); n != 1 {
			t.Errorf("%d lines with %q, want 1:\n%s", n, want, out)
		}
	}
	if n := f.count(t, "published_at IS NOT NULL"); n != len(evs) {
		t.Errorf("%d of %d events published after the wait", n, len(evs))
	}

	start := time.Now()
	r := run(t, "", nil, "relay", "--dsn", "postgres://app@"+deadAddr(t)+"/db", "--broker", "log://", "--fail-fast", "--http-addr", "")
	// A relay that retried instead would run until run's own limit kills
	// it: another exit code.
	if r.code != exitError || !strings.Contains(r.stderr, "database") {
		t.Fatalf("--fail-fast: exit %d after %s:\n%s", r.code, time.Since(start), r.stderr)
	}
}

// A missing outbox table does not heal: relay, stats and dead list stop
// at once and name the migration.
func TestMissingTableStopsAtOnce(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t) // never migrated
	for _, args := range [][]string{
		{"relay", "--broker", "log://", "--http-addr", ""},
		{"stats"},
		{"dead", "list"},
	} {
		start := time.Now()
		r := run(t, "", nil, append(args, "--dsn", dsn)...)
		if r.code != exitError { // a relay that retried would be killed by run's limit
			t.Errorf("%v: exit %d after %s, want 1 at once:\n%s", args, r.code, time.Since(start), r.stderr)
		}
		if !strings.Contains(r.stderr, "table outbox_events does not exist: run 'txoutbox migrate'") {
			t.Errorf("%v: the error does not name the migration:\n%s", args, r.stderr)
		}
		if n := strings.Count(r.stderr, "42P01"); n > 0 {
			t.Errorf("%v: the driver's text %d times at info level:\n%s", args, n, r.stderr)
		}
	}
}

// A second relay on the host fails on the port, and says which flag moves
// it; by default the server binds loopback only.
func TestHTTPAddr(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	r := run(t, "", nil, "relay", "--dsn", f.dsn, "--broker", "log://", "--http-addr", ln.Addr().String())
	if r.code == 0 || !strings.Contains(r.stderr, "another relay on this host") || !strings.Contains(r.stderr, "--http-addr") {
		t.Fatalf("port in use: exit %d:\n%s", r.code, r.stderr)
	}
	help := run(t, "", nil, "relay", "--help")
	if !strings.Contains(help.stdout, `--http-addr string`) || !strings.Contains(help.stdout, `(default "127.0.0.1:9090")`) {
		t.Fatalf("--http-addr does not default to loopback:\n%s", help.stdout)
	}
}
