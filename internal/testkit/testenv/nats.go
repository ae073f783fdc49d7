package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// NATSURL returns the URL of the shared nats-server (JetStream on disk)
// that scripts/services.sh starts.
func NATSURL(t testing.TB) string {
	t.Helper()
	return Env(t, "TXOUTBOX_NATS_URL")
}

// NATS is a nats-server of one test with JetStream on disk, which the test
// may stop (SIGTERM, or SIGKILL with Crash) and start again on the same
// port and storage.
type NATS struct {
	dir  string
	port int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error
}

// StartNATS starts a nats-server (Debian's, which make test installs) on a
// free port; the end of the test stops it and removes its storage.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	dir, err := os.MkdirTemp("", "txoutbox-nats")
	if err != nil {
		t.Fatal(err)
	}
	n := &NATS{dir: dir, port: FreePort(t)}
	t.Cleanup(func() {
		n.signal(syscall.SIGKILL)
		os.RemoveAll(dir)
	})
	n.Start(t)
	return n
}

// URL is the server's client URL.
func (n *NATS) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// Start starts the server and waits (at most 30 s) until it takes
// connections.
func (n *NATS) Start(t testing.TB) {
	t.Helper()
	cmd := exec.Command("nats-server", "-a", "127.0.0.1", "-p", fmt.Sprint(n.port), "-js", "-sd", filepath.Join(n.dir, "js"),
		"-l", filepath.Join(n.dir, "log"))
	if err := cmd.Start(); err != nil {
		t.Fatalf("nats-server: %v (make test installs Debian's nats-server)", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	n.mu.Lock()
	n.cmd, n.exited = cmd, exited
	n.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case werr := <-exited:
			log, _ := os.ReadFile(filepath.Join(n.dir, "log"))
			t.Fatalf("nats-server exited at start (%v); its log:\n%s", werr, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server takes no connection after 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop shuts the server down cleanly (SIGTERM) and waits until it is
// gone; JetStream's storage stays for the next Start.
func (n *NATS) Stop(t testing.TB) {
	t.Helper()
	if !n.signal(syscall.SIGTERM) {
		t.Fatal("stop: the nats-server is not running")
	}
}

// Crash kills the server (SIGKILL) and waits until it is gone.
func (n *NATS) Crash(t testing.TB) {
	t.Helper()
	if !n.signal(syscall.SIGKILL) {
		t.Fatal("crash: the nats-server is not running")
	}
}

func (n *NATS) signal(sig syscall.Signal) bool {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.cmd = nil
	n.mu.Unlock()
	if cmd == nil {
		return false
	}
	_ = cmd.Process.Signal(sig)
	<-exited
	return true
}
