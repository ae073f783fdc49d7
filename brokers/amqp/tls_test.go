package amqpbroker_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"

	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// tlsFront terminates TLS with a fresh self-signed certificate for
// 127.0.0.1 and forwards to the test RabbitMQ's plain port, so that an
// amqps:// URL is exercised end to end. It returns the amqps:// URL (with
// the same credentials) and the pool that trusts the certificate.
func tlsFront(t *testing.T) (string, *x509.CertPool) {
	t.Helper()
	plain, err := url.Parse(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cert, pool := fixtures.SelfSigned(t, "txoutbox test RabbitMQ")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", plain.Host)
				if err != nil {
					return
				}
				defer up.Close()
				go io.Copy(up, c)
				io.Copy(c, up)
			}()
		}
	}()
	u := *plain
	u.Scheme = "amqps"
	u.Host = ln.Addr().String()
	return u.String(), pool
}

// amqps:// in the URL dials TLS and verifies the server's certificate:
// with the private CA in Options.TLSConfig events go through, without it
// (system roots) the dial is refused.
func TestTLSThroughURL(t *testing.T) {
	t.Parallel()
	tlsURL, pool := tlsFront(t)
	if _, err := amqpbroker.NewPublisher(amqpbroker.Options{URL: tlsURL, Logger: quiet}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("amqps:// to an untrusted certificate: NewPublisher = %v, want a certificate error", err)
	} else if !errors.Is(err, amqpbroker.ErrNotConnected) {
		t.Errorf("dial error %v does not wrap ErrNotConnected", err)
	}
	tlsConfig := &tls.Config{RootCAs: pool}
	et := "order.tls." + testenv.RandomSuffix()
	sub := newSubscriber(t, amqpbroker.SubscriberOptions{URL: tlsURL, TLSConfig: tlsConfig})
	got := fixtures.Receive(t, sub, et)
	p := newPublisher(t, amqpbroker.Options{URL: tlsURL, TLSConfig: tlsConfig})
	evs := []core.Event{event(t, et, "o-1", 0), event(t, et, "o-1", 1)}
	if err := p.Publish(t.Context(), evs); err != nil {
		t.Fatal(err)
	}
	got.WaitIDs(t, fixtures.EventIDs(evs))
	rawChannel(t).ExchangeDelete(et, false, false)
}
