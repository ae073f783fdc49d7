package kafkabroker_test

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
)

// TLS and SASL are sarama settings passed as Options.Sarama: against a
// cluster that requires both, the publisher and a consumer group work with
// the right credentials and CA, and a wrong password is refused.
func TestTLSAndSASL(t *testing.T) {
	t.Parallel()
	cert, pool := fixtures.SelfSigned(t, "txoutbox test Kafka")
	cl := newCluster(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}}),
		kfake.EnableSASL(), kfake.Superuser("PLAIN", "relay", "s3cret"))
	secure := func(password string) *sarama.Config {
		cfg := kafkabroker.NewSaramaConfig()
		cfg.Net.TLS.Enable = true
		cfg.Net.TLS.Config = &tls.Config{RootCAs: pool}
		cfg.Net.SASL.Enable = true
		cfg.Net.SASL.Mechanism = sarama.SASLTypePlaintext
		cfg.Net.SASL.User, cfg.Net.SASL.Password = "relay", password
		cfg.Metadata.Retry.Max = 0
		return cfg
	}
	if p, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: cl.addrs, Sarama: secure("wrong")}); err == nil {
		p.Close()
		t.Fatal("NewPublisher with a wrong password succeeded")
	}
	p := newPublisher(t, cl.addrs, kafkabroker.Options{Sarama: secure("s3cret")})
	subCfg := secure("s3cret")
	subCfg.Consumer.Group.Session.Timeout = 2 * time.Second
	subCfg.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	sub, err := kafkabroker.NewSubscriber(kafkabroker.SubscriberOptions{Brokers: cl.addrs, ConsumerGroup: "tls", Sarama: subCfg, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	got := fixtures.Receive(t, sub, "order.secure")
	evs := []core.Event{event(t, "order.secure", "o-1", 0), event(t, "order.secure", "o-1", 1)}
	if err := p.Publish(t.Context(), evs); err != nil {
		t.Fatal(err)
	}
	got.WaitIDs(t, fixtures.EventIDs(evs))
}
