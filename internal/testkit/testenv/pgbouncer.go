package testenv

import (
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testkit/cancelgate"
)

// PgBouncerDSN makes a fresh PostgreSQL database (as PostgresDSN) and
// returns its DSN through the PgBouncer that scripts/services.sh runs in
// transaction pooling mode (TXOUTBOX_PGBOUNCER_DSN), and its direct DSN.
// params are added to the bouncer's DSN's query (pgx's
// default_query_exec_mode=exec, say).
func PgBouncerDSN(t testing.TB, params ...string) (bouncer, direct string) {
	t.Helper()
	direct = PostgresDSN(t)
	d, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	b, err := url.Parse(Env(t, "TXOUTBOX_PGBOUNCER_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	b.Path = d.Path
	q := b.Query()
	for i := 0; i+1 < len(params); i += 2 {
		q.Set(params[i], params[i+1])
	}
	b.RawQuery = q.Encode()
	return b.String(), direct
}

// PgBouncer is a pgbouncer of one test (Debian's, which make test
// installs), in transaction pooling mode in front of a PostgreSQL server,
// which the test may stop and start again on the same port.
type PgBouncer struct {
	dir   string
	port  int // the gate's, which clients dial
	inner int // pgbouncer's own

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error
}

// StartPgBouncer starts a pgbouncer on a free port in front of the server
// at pgHostPort ("127.0.0.1:24432"), trusting every user as the test
// cluster does; the end of the test stops it.
func StartPgBouncer(t testing.TB, pgHostPort string) *PgBouncer {
	t.Helper()
	host, port, err := net.SplitHostPort(pgHostPort)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "txoutbox-pgbouncer")
	if err != nil {
		t.Fatal(err)
	}
	// Clients reach the bouncer through a cancel gate, as they reach the
	// shared one: a cancel request can make PgBouncer 1.18 exit
	// (internal/testkit/cancelgate).
	gate, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gateLog, err := os.Create(filepath.Join(dir, "gate.log"))
	if err != nil {
		t.Fatal(err)
	}
	b := &PgBouncer{dir: dir, port: gate.Addr().(*net.TCPAddr).Port, inner: FreePort(t)}
	go cancelgate.Serve(gate, fmt.Sprintf("127.0.0.1:%d", b.inner), log.New(gateLog, "", log.LstdFlags))
	t.Cleanup(func() {
		gate.Close()
		b.signal(syscall.SIGKILL)
		gateLog.Close()
		os.RemoveAll(dir)
	})
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s/users.txt
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = %s/pgbouncer.log
`, host, port, b.inner, dir, dir)
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(`"postgres" ""`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b.Start(t)
	return b
}

// DSN is the DSN of database name through the bouncer, with pgx's
// default_query_exec_mode=exec.
func (b *PgBouncer) DSN(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&default_query_exec_mode=exec", b.port, name)
}

// GateLog returns what the bouncer's cancel gate logged: one line per
// cancel request it kept from the bouncer.
func (b *PgBouncer) GateLog() string {
	log, _ := os.ReadFile(filepath.Join(b.dir, "gate.log"))
	return string(log)
}

// Start starts the bouncer and waits (at most 30 s) until it takes
// connections. pgbouncer refuses to run as root: as root the test runs it
// as the postgres user.
func (b *PgBouncer) Start(t testing.TB) {
	t.Helper()
	cmd := exec.Command("/usr/sbin/pgbouncer", filepath.Join(b.dir, "pgbouncer.ini"))
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgbouncer runs as the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(b.dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("pgbouncer: %v (make test installs Debian's pgbouncer)", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	b.mu.Lock()
	b.cmd, b.exited = cmd, exited
	b.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", b.inner), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case werr := <-exited:
			log, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
			t.Fatalf("pgbouncer exited at start (%v); its log:\n%s", werr, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer takes no connection after 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop shuts the bouncer down at once (SIGTERM: its clients' connections
// close) and waits until it is gone. Until Start, the gate takes new
// connections and closes them at once.
func (b *PgBouncer) Stop(t testing.TB) {
	t.Helper()
	if !b.signal(syscall.SIGTERM) {
		t.Fatal("stop: the pgbouncer is not running")
	}
}

func (b *PgBouncer) signal(sig syscall.Signal) bool {
	b.mu.Lock()
	cmd, exited := b.cmd, b.exited
	b.cmd = nil
	b.mu.Unlock()
	if cmd == nil {
		return false
	}
	_ = cmd.Process.Signal(sig)
	<-exited
	return true
}
