package testenv

import (
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/txoutbox/txoutbox/testing/sqlfixture"
)

// pgBin is where Debian's PostgreSQL 15 puts its programs (make test
// installs it).
func pgBin() string {
	if v := os.Getenv("TXOUTBOX_PGBIN"); v != "" {
		return v
	}
	return "/usr/lib/postgresql/15/bin"
}

// Cluster is a throwaway, durable PostgreSQL cluster of one test, which the
// test may crash (pg_ctl stop -m immediate: no checkpoint, no clean
// shutdown, as a power cut) and start again (crash recovery from the WAL).
// It runs with wal_level = logical, for log mode.
type Cluster struct {
	dir, addr string
}

// StartCluster initialises and starts a cluster on a free port; the end
// of the test stops and removes it.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "txoutbox-crash-pg")
	if err != nil {
		t.Fatal(err)
	}
	port := FreePort(t)
	c := &Cluster{dir: dir, addr: fmt.Sprintf("127.0.0.1:%d", port)}
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
	conf := fmt.Sprintf("listen_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\nfsync = %s\nfull_page_writes = %[3]s\nsynchronous_commit = on\n"+
		"max_connections = 100\nwal_level = logical\nmax_wal_senders = 10\nmax_replication_slots = 10\n", port, dir, onOff(Fsync()))
	f, err := os.OpenFile(filepath.Join(c.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(conf)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	c.Start(t)
	return c
}

// FreePort returns a loopback TCP port that nothing listens on now, for a
// server a test starts, and may stop and start again on the same port. It
// is taken below the kernel's ephemeral range, from which every outgoing
// connection of the run takes its local port: a port of that range could
// be taken by one of them before the server binds it (a cluster failed to
// start so in a make test run) or between a crash and the restart. It
// also stays clear of services.sh's ports (24xxx), which the outage tests
// free while their broker is down, and of the ports this process handed
// out before.
func FreePort(t testing.TB) int {
	t.Helper()
	hi := ephemeralLow()
	lo := hi - 6000
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		port := lo + mathrand.IntN(hi-lo)
		if portsGiven[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		portsGiven[port] = true
		return port
	}
	t.Fatalf("no free port in [%d, %d)", lo, hi)
	return 0
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// ephemeralLow is the first port of the kernel's ephemeral range (32768 by
// default on Linux), from /proc when it can be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 26000 {
				return n
			}
		}
	}
	return 32768
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

// AdminDSN may create databases.
func (c *Cluster) AdminDSN() string {
	return "postgres://postgres@" + c.addr + "/postgres?sslmode=disable"
}

// NewDatabase creates a database on the cluster and returns its DSN.
func (c *Cluster) NewDatabase(t testing.TB) string {
	return sqlfixture.CreatePostgresDatabase(t, c.AdminDSN())
}

// Start starts the cluster and waits until it takes connections.
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	log := filepath.Join(c.dir, "log")
	if err := c.pg("pg_ctl", "-D", c.data(), "-l", log, "-w", "-t", "60", "start"); err != nil {
		b, _ := os.ReadFile(log)
		t.Fatalf("%v\nthe server's log (%s):\n%s", err, c.addr, b)
	}
}

// Crash stops the cluster at once (pg_ctl stop -m immediate).
func (c *Cluster) Crash(t testing.TB) {
	c.mustPG(t, "pg_ctl", "-D", c.data(), "-m", "immediate", "stop")
}

// pg runs a PostgreSQL program as the postgres user (as root) or as
// ourselves.
func (c *Cluster) pg(prog string, args ...string) error {
	cmd := exec.Command(filepath.Join(pgBin(), prog), args...)
	if os.Geteuid() == 0 {
		quoted := make([]string, len(args))
		for i, a := range args {
			quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		cmd = exec.Command("su", "postgres", "-s", "/bin/sh", "-c", filepath.Join(pgBin(), prog)+" "+strings.Join(quoted, " "))
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %v: %v\n%s", prog, args, err, out)
	}
	return nil
}

func (c *Cluster) mustPG(t testing.TB, prog string, args ...string) {
	t.Helper()
	if err := c.pg(prog, args...); err != nil {
		t.Fatal(err)
	}
}
