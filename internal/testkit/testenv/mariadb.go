package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txoutbox/txoutbox/testing/sqlfixture"
)

// MariaDB is a throwaway, durable MariaDB server of one test (Debian's
// mariadbd, which make test installs), which the test may crash (SIGKILL:
// no clean shutdown, as a power cut) and start again (InnoDB recovers from
// its redo log).
type MariaDB struct {
	dir  string
	port int

	mu     sync.Mutex
	cmd    *exec.Cmd  // the running server, nil while it is down
	exited chan error // its Wait's result
}

// StartMariaDB initialises and starts a server on a free port; the end of
// the test stops it and removes its files.
func StartMariaDB(t testing.TB) *MariaDB {
	t.Helper()
	dir, err := os.MkdirTemp("", "txoutbox-crash-mariadb")
	if err != nil {
		t.Fatal(err)
	}
	m := &MariaDB{dir: dir, port: FreePort(t)}
	t.Cleanup(func() {
		m.kill()
		os.RemoveAll(dir)
	})
	// Durable unless Fsync says otherwise: every commit waits for its redo
	// log flush (1, the default), or writes it to the page cache (2).
	flush := 2
	if Fsync() {
		flush = 1
	}
	conf := fmt.Sprintf(`[mariadbd]
datadir = %[1]s/data
socket = %[1]s/mariadbd.sock
pid-file = %[1]s/mariadbd.pid
port = %[2]d
bind-address = 127.0.0.1
skip-name-resolve
max_connections = 200
innodb_buffer_pool_size = 64M
innodb_log_file_size = 48M
innodb_flush_log_at_trx_commit = %[3]d
log-error = %[1]s/error.log
# Its own temporary directory: a starting MariaDB deletes every #sql* file
# in its tmpdir (left over, it assumes, from its own crash), so servers
# sharing /tmp removed each other's live temporary tables ("Error on delete
# of '/tmp/#sql-update-....MAI' (Errcode: 2)" in a make test run).
tmpdir = %[1]s
log-bin = %[1]s/binlog
binlog_format = ROW
binlog_row_metadata = FULL
server_id = 1
`, dir, m.port, flush)
	if os.Geteuid() == 0 {
		conf += "user = root\n"
	}
	if err := os.WriteFile(m.cnf(), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// Root without a password over the socket, whoever runs the test.
	install := exec.Command("mariadb-install-db", "--defaults-file="+m.cnf(), "--auth-root-authentication-method=normal", "--skip-test-db")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	m.Start(t)
	root := m.rootDB(t)
	defer root.Close()
	if _, err := root.Exec("CREATE USER 'txoutbox'@'127.0.0.1' IDENTIFIED BY 'test-pw'"); err != nil {
		t.Fatal(err)
	}
	if _, err := root.Exec("GRANT ALL PRIVILEGES ON *.* TO 'txoutbox'@'127.0.0.1'"); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m *MariaDB) cnf() string { return filepath.Join(m.dir, "my.cnf") }

func (m *MariaDB) rootDB(t testing.TB) *sql.DB {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = "root", "unix", filepath.Join(m.dir, "mariadbd.sock")
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// NewDatabase creates a database on the server and returns its DSN (TCP,
// as the tests' other MariaDB DSNs).
func (m *MariaDB) NewDatabase(t testing.TB) string {
	return sqlfixture.CreateMySQLDatabase(t, fmt.Sprintf("mysql://txoutbox:test-pw@127.0.0.1:%d/", m.port))
}

// Start starts the server and waits (at most a minute) until it takes
// connections.
func (m *MariaDB) Start(t testing.TB) {
	t.Helper()
	cmd := exec.Command("/usr/sbin/mariadbd", "--defaults-file="+m.cnf())
	if err := cmd.Start(); err != nil {
		t.Fatalf("mariadbd: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	m.mu.Lock()
	m.cmd, m.exited = cmd, exited
	m.mu.Unlock()
	root := m.rootDB(t)
	defer root.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := root.PingContext(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case werr := <-exited:
			m.mu.Lock()
			m.cmd = nil
			m.mu.Unlock()
			log, _ := os.ReadFile(filepath.Join(m.dir, "error.log"))
			t.Fatalf("mariadbd exited at start (%v); its error log:\n%s", werr, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("mariadbd takes no connection after a minute: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Crash kills the server (SIGKILL) and waits until it is gone.
func (m *MariaDB) Crash(t testing.TB) {
	t.Helper()
	if !m.kill() {
		t.Fatal("crash: the MariaDB server is not running")
	}
}

func (m *MariaDB) kill() bool {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return false
	}
	_ = cmd.Process.Kill()
	<-exited
	return true
}
