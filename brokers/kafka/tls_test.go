package kafkabroker_test

import (
	"crypto/tls"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
)

// TLS and SASL are franz-go options passed as Options.Client: against a
// cluster that requires both, the publisher and a consumer group work with
// the right credentials and CA, and a wrong password is refused.
func TestTLSAndSASL(t *testing.T) {
	t.Parallel()
	cert, pool := fixtures.SelfSigned(t, "txoutbox test Kafka")
	cl := newCluster(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}}),
		kfake.EnableSASL(), kfake.Superuser("PLAIN", "relay", "s3cret"))
	secure := func(password string) []kgo.Opt {
		return []kgo.Opt{
			kgo.DialTLSConfig(&tls.Config{RootCAs: pool}),
			kgo.SASL(plain.Auth{User: "relay", Pass: password}.AsMechanism()),
		}
	}
	if p, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: cl.addrs, Client: secure("wrong")}); err == nil {
		p.Close()
		t.Fatal("NewPublisher with a wrong password succeeded")
	}
	p := newPublisher(t, cl.addrs, kafkabroker.Options{Client: secure("s3cret")})
	sub := newSubscriber(t, cl.addrs, "tls", secure("s3cret")...)
	got := fixtures.Receive(t, sub, "order.secure")
	evs := []core.Event{event(t, "order.secure", "o-1", 0), event(t, "order.secure", "o-1", 1)}
	if err := p.Publish(t.Context(), evs); err != nil {
		t.Fatal(err)
	}
	got.WaitIDs(t, fixtures.EventIDs(evs))
}
