package natsbroker

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/txoutbox/txoutbox/core"
)

// Sentinel errors. Each wraps the cause, so errors.Is finds both.
var (
	// ErrPublish marks an event JetStream did not acknowledge: the
	// connection was down, no stream captured its subject, the
	// acknowledgement did not come in time. The relay retries it.
	ErrPublish = errors.New("natsbroker: publish failed")
	// ErrEarlierFailed marks an event held back because an earlier event
	// of its aggregate in the same batch failed: sending it would let it
	// overtake that event's retry.
	ErrEarlierFailed = errors.New("natsbroker: an earlier event of the aggregate failed")
)

// DefaultAckTimeout is the default Options.AckTimeout.
const DefaultAckTimeout = 10 * time.Second

// connect dials rawURL with reconnects forever, and logs each disconnect
// and reconnect once. Messages are not buffered while disconnected: a
// publish then fails at once and the relay retries it, instead of a
// buffered copy reaching JetStream after its event was already retried.
func connect(rawURL, name string, log *slog.Logger) (*nats.Conn, error) {
	if rawURL == "" {
		return nil, fmt.Errorf("%w: natsbroker: URL is empty (nats://host:4222)", core.ErrInvalidOptions)
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "" {
		return nil, fmt.Errorf("%w: natsbroker: URL %q: want nats://host:port or tls://host:port", core.ErrInvalidOptions, redact(rawURL))
	}
	nc, err := nats.Connect(rawURL,
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			if c.IsClosed() {
				return // our own Close
			}
			log.Warn("natsbroker: disconnected; reconnecting", "client", name, "err", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("natsbroker: reconnected", "client", name, "server", c.ConnectedUrlRedacted())
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("natsbroker: connect to %s: %w", redact(rawURL), err)
	}
	return nc, nil
}

// redact hides the password or token of a NATS URL.
func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "nats://(unparsable URL)"
	}
	return u.Redacted()
}
