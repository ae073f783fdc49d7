// Package faultproxy puts a fault-injecting TCP proxy between a client and
// a server in tests: added latency, a bandwidth limit, connections reset,
// a blackhole (bytes are held, nothing answers) and a refused connection.
// It runs Shopify's toxiproxy in the test process, so there is nothing to
// install or start.
//
//	p := faultproxy.Start(t, "127.0.0.1:5672") // RabbitMQ
//	pub := newPublisher("amqp://guest:guest@" + p.Addr() + "/")
//	p.Blackhole()   // the broker stops answering
//	...
//	p.Heal()        // and is back
package faultproxy

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy forwards one listening address to an upstream address, with the
// faults its methods turn on. Its methods are safe for concurrent use.
type Proxy struct {
	mu      sync.Mutex
	p       *toxiproxy.Proxy
	refused bool
	toxics  []string
}

var (
	serverOnce sync.Once
	server     *toxiproxy.ApiServer
)

// New starts a proxy on a free loopback port to upstream (host:port).
// Close it when done.
func New(upstream string) (*Proxy, error) {
	serverOnce.Do(func() {
		server = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	})
	p := toxiproxy.NewProxy(server, "proxy-"+strings.NewReplacer(":", "-", ".", "-").Replace(upstream), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("faultproxy: start a proxy to %s: %w", upstream, err)
	}
	return &Proxy{p: p}, nil
}

// Start is New for a test: it fails the test on error and closes the proxy
// when the test ends.
func Start(t testing.TB, upstream string) *Proxy {
	t.Helper()
	p, err := New(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// Addr is the address clients dial instead of the upstream's (host:port).
func (p *Proxy) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.p.Listen
}

// Latency delays every chunk of bytes by d, both ways.
func (p *Proxy) Latency(d time.Duration) error {
	return p.add("latency", map[string]any{"latency": d.Milliseconds()})
}

// Bandwidth limits each connection to kbps kilobytes per second, both
// ways.
func (p *Proxy) Bandwidth(kbps int64) error {
	return p.add("bandwidth", map[string]any{"rate": kbps})
}

// Reset resets every connection, open and new, with a TCP RST as soon as
// it carries data, until Heal.
func (p *Proxy) Reset() error {
	return p.add("reset_peer", map[string]any{"timeout": 0})
}

// Blackhole holds every byte, both ways, on open and new connections:
// connections are accepted and never answered, until Heal, which lets what
// was held through.
func (p *Proxy) Blackhole() error {
	return p.add("timeout", map[string]any{"timeout": 0})
}

// Refuse closes the listener and every connection: new connections are
// refused until Heal.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.refused {
		p.p.Stop()
		p.refused = true
	}
}

// Heal removes every fault.
func (p *Proxy) Heal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, name := range p.toxics {
		if err := p.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
			return fmt.Errorf("faultproxy: remove %s: %w", name, err)
		}
	}
	p.toxics = nil
	if p.refused {
		if err := p.p.Start(); err != nil {
			return fmt.Errorf("faultproxy: listen again on %s: %w", p.p.Listen, err)
		}
		p.refused = false
	}
	return nil
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.p.Stop()
}

func (p *Proxy) add(kind string, attrs map[string]any) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, stream := range []string{"downstream", "upstream"} {
		name := kind + "_" + stream
		js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, kind, stream, jsonOf(attrs))
		if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			return fmt.Errorf("faultproxy: %s: %w", kind, err)
		}
		p.toxics = append(p.toxics, name)
	}
	return nil
}

func jsonOf(m map[string]any) string {
	parts := make([]string, 0, len(m))
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%q:%v", k, v))
	}
	return "{" + strings.Join(parts, ",") + "}"
}
