package cancelgate

import (
	"bytes"
	"encoding/binary"
	"io"
	"log"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testkit/logbuf"
)

// gate starts a gate in front of a listener standing in for PgBouncer and
// returns the gate's address, the stand-in, and the gate's log.
func gate(t *testing.T) (addr string, bouncer net.Listener, logs *logbuf.Buffer) {
	t.Helper()
	bouncer, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs = new(logbuf.Buffer)
	go Serve(l, bouncer.Addr().String(), log.New(logs, "", 0))
	t.Cleanup(func() { l.Close(); bouncer.Close() })
	return l.Addr().String(), bouncer, logs
}

func message(length, code uint32, rest ...byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, length)
	b = binary.BigEndian.AppendUint32(b, code)
	return append(b, rest...)
}

// A cancel request never reaches the bouncer: the gate closes it.
func TestGateDropsCancelRequests(t *testing.T) {
	t.Parallel()
	addr, bouncer, logs := gate(t)
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := bouncer.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// pid 42, secret key 7, as pgx sends them.
	if _, err := c.Write(message(16, cancelRequestCode, 0, 0, 0, 42, 0, 0, 0, 7)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after a cancel request the gate answered %d bytes, %v; want the connection closed", n, err)
	}
	select {
	case <-accepted:
		t.Fatal("the cancel request reached the bouncer")
	case <-time.After(200 * time.Millisecond):
	}
	if !strings.Contains(logs.String(), "dropped a cancel request") {
		t.Errorf("the gate's log does not say it dropped the cancel request: %q", logs.String())
	}
}

// Every other connection (a startup message, an SSLRequest) goes through
// byte for byte both ways, its first message in one piece even when the
// client sent it in two, and the client's leaving reaches the bouncer.
func TestGatePassesConnectionsThrough(t *testing.T) {
	t.Parallel()
	addr, bouncer, _ := gate(t)
	for name, first := range map[string][]byte{
		// protocol 3.0, user=postgres
		"startup":    message(23, 196608, append([]byte("user\x00postgres\x00"), 0)...),
		"SSLRequest": message(8, 80877103),
	} {
		// The bouncer's side reads as soon as it is connected, in one
		// read, as PgBouncer 1.18 reads a startup message.
		type accepted struct {
			s    net.Conn
			read []byte
			err  error
		}
		at := make(chan accepted, 1)
		go func() {
			s, err := bouncer.Accept()
			if err != nil {
				at <- accepted{err: err}
				return
			}
			s.SetReadDeadline(time.Now().Add(5 * time.Second))
			got := make([]byte, 100)
			n, err := s.Read(got)
			at <- accepted{s, got[:n], err}
		}()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		// The length and code, then the rest a moment later.
		for _, part := range [][]byte{first[:8], first[8:]} {
			if len(part) == 0 {
				continue
			}
			if _, err := c.Write(part); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		a := <-at
		if a.err != nil || !bytes.Equal(a.read, first) {
			t.Fatalf("%s: the bouncer's first read got %q, %v; want %q", name, a.read, a.err, first)
		}
		s := a.s
		if _, err := s.Write([]byte("N")); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		reply := make([]byte, 1)
		if _, err := io.ReadFull(c, reply); err != nil || reply[0] != 'N' {
			t.Fatalf("%s: the client read %q, %v; want the bouncer's N", name, reply, err)
		}
		c.Close()
		if n, err := s.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("%s: after the client left the bouncer read %d bytes, %v; want EOF", name, n, err)
		}
		s.Close()
	}
}
