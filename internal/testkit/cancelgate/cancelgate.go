// Package cancelgate is a TCP relay for a PgBouncer: it passes every
// connection through byte for byte, except PostgreSQL cancel requests,
// which it answers by closing the connection.
//
// PgBouncer 1.18 (Debian 12's, the one make test installs) exits with
// "server_proto: server in bad state: 11" when a server's reply reaches it
// while it still handles a cancel request for that server (pgbouncer#822,
// fixed by pgbouncer#927 in 1.21). pgx sends a cancel request whenever a
// context ends while a query runs, so any test that stops a relay
// mid-claim could take a bouncer down, and with it every test connected
// to it. Without the cancel, PgBouncer sees the client leave and closes
// the server connection it held, which ends the query just as well for
// the short statements of these tests.
//
// A cancel request is always the first and only message of its own
// connection (PostgreSQL's frontend/backend protocol, "Canceling Requests
// in Progress"), so reading each connection's first message finds them
// all; the gate then hands that message on whole and copies the rest.
package cancelgate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"time"
)

// cancelRequestCode is the protocol's request code of a cancel request
// (1234 << 16 | 5678), sent after the message's length, 16.
const cancelRequestCode = 80877102

// Serve relays each connection l accepts to target until l is closed,
// logging the cancel requests it drops and the connections it cannot
// relay to logger.
func Serve(l net.Listener, target string, logger *log.Logger) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go relay(c, target, logger)
	}
}

// maxFirst bounds a connection's first message (a startup message of
// a few parameters is well under a kilobyte; PostgreSQL allows 10,000
// bytes).
const maxFirst = 10000

// readFirst reads a connection's first message: its length (four bytes,
// counting themselves) and the rest.
func readFirst(c net.Conn) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n < 8 || n > maxFirst {
		return nil, fmt.Errorf("a first message of %d bytes is no startup, SSL or cancel request", n)
	}
	first := make([]byte, n)
	copy(first, size[:])
	if _, err := io.ReadFull(c, first[4:]); err != nil {
		return nil, err
	}
	return first, nil
}

// relay passes c through to target, or closes it if it is a cancel
// request.
func relay(c net.Conn, target string, logger *log.Logger) {
	defer c.Close()
	// A client that connects and says nothing must not hold a goroutine
	// forever.
	c.SetReadDeadline(time.Now().Add(time.Minute))
	first, err := readFirst(c)
	if err != nil {
		// Readiness probes connect and leave without a word.
		if !errors.Is(err, io.EOF) {
			logger.Printf("cancelgate: %s: %v", c.RemoteAddr(), err)
		}
		return
	}
	c.SetReadDeadline(time.Time{})
	if len(first) == 16 && binary.BigEndian.Uint32(first[4:8]) == cancelRequestCode {
		logger.Printf("cancelgate: dropped a cancel request from %s (pgbouncer#822)", c.RemoteAddr())
		return
	}
	s, err := net.Dial("tcp", target)
	if err != nil {
		logger.Printf("cancelgate: %v", err)
		return
	}
	defer s.Close()
	// In one write: PgBouncer 1.18 refuses a startup message that reaches
	// it in pieces ("client sent partial pkt in startup phase").
	if _, err := s.Write(first); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		io.Copy(c, s)
		// The bouncer hung up: so does the client's side.
		c.Close()
		close(done)
	}()
	io.Copy(s, c)
	// The client hung up (or its side failed): let the bouncer see it at
	// once, as it would without the gate.
	s.Close()
	<-done
}
