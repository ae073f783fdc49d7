package amqpbroker

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Reconnect tunes how a lost connection is re-dialled: after Min, doubling
// up to Max, with jitter.
type Reconnect struct {
	// Min is the first pause. Default 200ms.
	Min time.Duration
	// Max caps the pause. Default 10s.
	Max time.Duration
}

func (r Reconnect) withDefaults() Reconnect {
	if r.Min <= 0 {
		r.Min = 200 * time.Millisecond
	}
	if r.Max <= 0 {
		r.Max = 10 * time.Second
	}
	if r.Max < r.Min {
		r.Max = r.Min
	}
	return r
}

// conn is one AMQP connection that is re-dialled, with backoff, whenever it
// closes, until close is called.
//
// watermill-amqp's ConnectionWrapper does the same, but its reconnect
// goroutine replaces the connected channel without synchronisation while
// publishers and subscribers read it, which the race detector reports on
// every broker restart; conn guards its state with a mutex instead.
type conn struct {
	dial  func() (*amqp.Connection, error)
	recon Reconnect
	log   *slog.Logger

	mu   sync.Mutex
	c    *amqp.Connection // nil while down
	gen  uint64           // incremented by every successful dial
	up   chan struct{}    // closed when c is set; replaced when it drops
	done chan struct{}    // closed by close
	wg   sync.WaitGroup
}

func dialer(url string, tlsConfig *tls.Config, name string) func() (*amqp.Connection, error) {
	return func() (*amqp.Connection, error) {
		cfg := amqp.Config{
			Heartbeat:       10 * time.Second,
			Locale:          "en_US",
			TLSClientConfig: tlsConfig,
			Properties:      amqp.Table{"connection_name": name},
		}
		// DialConfig parses credentials and vhost from the URL and dials TLS
		// for amqps://, with the system roots unless TLSClientConfig is set.
		return amqp.DialConfig(url, cfg)
	}
}

// newConn dials once (a wrong URL or credentials fail here) and keeps the
// connection up from then on.
func newConn(dial func() (*amqp.Connection, error), recon Reconnect, log *slog.Logger) (*conn, error) {
	c, err := dial()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotConnected, err)
	}
	up := make(chan struct{})
	close(up)
	k := &conn{dial: dial, recon: recon.withDefaults(), log: log, c: c, gen: 1, up: up, done: make(chan struct{})}
	k.wg.Add(1)
	go k.supervise(c)
	return k, nil
}

func (k *conn) supervise(c *amqp.Connection) {
	defer k.wg.Done()
	for {
		closed := c.NotifyClose(make(chan *amqp.Error, 1))
		select {
		case <-k.done:
			return
		case err := <-closed:
			k.mu.Lock()
			k.c = nil
			k.up = make(chan struct{})
			k.mu.Unlock()
			k.log.Warn("amqpbroker: connection to RabbitMQ lost; re-dialling", "error", err)
		}
		wait := k.recon.Min
		for {
			select {
			case <-k.done:
				return
			case <-time.After(wait/2 + rand.N(wait/2+1)):
			}
			var err error
			if c, err = k.dial(); err == nil {
				break
			}
			k.log.Debug("amqpbroker: re-dial failed", "error", err, "retry_in", wait)
			wait = min(2*wait, k.recon.Max)
		}
		k.mu.Lock()
		select {
		case <-k.done:
			k.mu.Unlock()
			c.Close()
			return
		default:
		}
		k.c = c
		k.gen++
		close(k.up)
		k.mu.Unlock()
		k.log.Info("amqpbroker: reconnected to RabbitMQ")
	}
}

// dropDeadline bounds the close handshake of a dropped connection: a broker
// that stopped reading it never answers, and the socket is closed after it.
const dropDeadline = time.Second

// drop closes the connection of generation gen, if it is still the current
// one, without waiting; supervise then re-dials. It is for a connection on
// which RabbitMQ stopped answering: every synchronous call on it (channel
// close, channel open) would wait forever, and only closing its socket
// frees them.
func (k *conn) drop(gen uint64, why error) {
	k.mu.Lock()
	c := k.c
	current := c != nil && k.gen == gen
	k.mu.Unlock()
	if !current {
		return
	}
	k.log.Warn("amqpbroker: RabbitMQ did not answer in time; dropping the connection and re-dialling", "error", why)
	go c.CloseDeadline(time.Now().Add(dropDeadline))
}

// get returns the current connection and its generation, or
// ErrNotConnected while it is being re-dialled.
func (k *conn) get() (*amqp.Connection, uint64, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.c == nil {
		return nil, 0, ErrNotConnected
	}
	return k.c, k.gen, nil
}

// ready returns a channel closed once a connection is up.
func (k *conn) ready() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.up
}

func (k *conn) close() error {
	k.mu.Lock()
	select {
	case <-k.done:
		k.mu.Unlock()
		return nil
	default:
	}
	close(k.done)
	c := k.c
	k.c = nil
	k.mu.Unlock()
	k.wg.Wait()
	if c != nil && !c.IsClosed() {
		// Bounded, so that Close returns even when RabbitMQ stopped
		// answering this connection.
		// ErrClosed: a drop is closing it already.
		if err := c.CloseDeadline(time.Now().Add(closeDeadline)); err != nil && !errors.Is(err, amqp.ErrClosed) {
			return err
		}
	}
	return nil
}

// closeDeadline bounds the close handshake of Close.
const closeDeadline = 5 * time.Second
