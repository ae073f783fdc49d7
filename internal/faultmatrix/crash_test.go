package faultmatrix_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/txoutbox/txoutbox/testing/sqlfixture"
)

// pgBin is where Debian's PostgreSQL 15 puts its programs (make test
// installs it).
var pgBin = envOr("TXOUTBOX_PGBIN", "/usr/lib/postgresql/15/bin")

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// crashMu lets one cell at a time crash its server: the crash cells of
// the brokers run in parallel, each on a server of its own, but two
// immediate shutdowns at once on a 2-core machine stretch recovery.
var crashMu sync.Mutex

// crashable is a throwaway, durable PostgreSQL cluster of one test, which
// the test may crash (pg_ctl stop -m immediate: no checkpoint, no clean
// shutdown, as a power cut) and start again (crash recovery from the WAL).
type crashable struct {
	dir, addr string
}

func startCrashable(t *testing.T) *crashable {
	t.Helper()
	dir, err := os.MkdirTemp("", "txoutbox-crash-pg")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	c := &crashable{dir: dir, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chown", "postgres:", dir).CombinedOutput(); err != nil {
			t.Fatalf("chown: %v\n%s", err, out)
		}
	}
	t.Cleanup(func() {
		_ = c.pg("pg_ctl", "-D", c.data(), "-m", "immediate", "stop")
		os.RemoveAll(dir)
	})
	c.mustPG(t, "initdb", "-D", c.data(), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
	conf := fmt.Sprintf("listen_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\nfsync = on\nsynchronous_commit = on\nmax_connections = 100\n", port, dir)
	f, err := os.OpenFile(filepath.Join(c.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(conf)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	c.start(t)
	return c
}

func (c *crashable) data() string { return filepath.Join(c.dir, "data") }

// adminDSN may create databases.
func (c *crashable) adminDSN() string {
	return "postgres://postgres@" + c.addr + "/postgres?sslmode=disable"
}

// newDatabase creates a database on the cluster and returns its DSN.
func (c *crashable) newDatabase(t *testing.T) string {
	return sqlfixture.CreatePostgresDatabase(t, c.adminDSN())
}

func (c *crashable) start(t *testing.T) {
	c.mustPG(t, "pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "start")
}

func (c *crashable) crash(t *testing.T) {
	c.mustPG(t, "pg_ctl", "-D", c.data(), "-m", "immediate", "stop")
}

// pg runs a PostgreSQL program as the postgres user (as root) or as
// ourselves.
func (c *crashable) pg(prog string, args ...string) error {
	cmd := exec.Command(filepath.Join(pgBin, prog), args...)
	if os.Geteuid() == 0 {
		quoted := make([]string, len(args))
		for i, a := range args {
			quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		cmd = exec.Command("su", "postgres", "-s", "/bin/sh", "-c", filepath.Join(pgBin, prog)+" "+strings.Join(quoted, " "))
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %v: %v\n%s", prog, args, err, out)
	}
	return nil
}

func (c *crashable) mustPG(t *testing.T, prog string, args ...string) {
	t.Helper()
	if err := c.pg(prog, args...); err != nil {
		t.Fatal(err)
	}
}
