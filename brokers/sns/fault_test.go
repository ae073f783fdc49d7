package snsbroker_test

import (
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	snsbroker "github.com/txoutbox/txoutbox/brokers/sns"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/fixtures"
	outboxtest "github.com/txoutbox/txoutbox/testing"
	"github.com/txoutbox/txoutbox/testing/faultproxy"
)

// TestFaultMatrixSNS is the SNS column of the fault matrix
// (internal/faultmatrix has RabbitMQ and Kafka, with the relay as a
// process): the relay publishes to the SNS emulator through a fault proxy,
// standard topics unordered and FIFO topics ordered, while producers
// write; the consumer reads the SQS queues directly, through the inbox.
// Nothing may be lost, take effect twice, or (FIFO) be reordered.
func TestFaultMatrixSNS(t *testing.T) {
	t.Parallel()
	faults := []struct {
		name   string
		inject func(p *faultproxy.Proxy) error
	}{
		{"endpoint latency 200ms", func(p *faultproxy.Proxy) error { return p.Latency(200 * time.Millisecond) }},
		{"endpoint connections reset", func(p *faultproxy.Proxy) error { return p.Reset() }},
		{"endpoint blackholed", func(p *faultproxy.Proxy) error { return p.Blackhole() }},
		{"endpoint refuses connections", func(p *faultproxy.Proxy) error { p.Refuse(); return nil }},
	}
	var rows []string
	for _, fifo := range []bool{false, true} {
		mode, ordering := "standard", core.OrderingOff
		if fifo {
			mode, ordering = "fifo", core.OrderingOn
		}
		for _, f := range faults {
			t.Run(mode+"/"+strings.ReplaceAll(f.name, " ", "_"), func(t *testing.T) {
				var proxy *faultproxy.Proxy
				newBroker := func(t *testing.T) *outboxtest.BrokerFixture {
					g := newGoaws(t)
					u, err := url.Parse(g.endpoint)
					if err != nil {
						t.Fatal(err)
					}
					proxy = faultproxy.Start(t, u.Host)
					topic := func(eventType string) string {
						if fifo {
							return snsbroker.TopicName(eventType) + ".fifo"
						}
						return snsbroker.TopicName(eventType)
					}
					// One Publish per event: goaws has no PublishBatch.
					pub, err := snsbroker.NewPublisher(newSNSClient(t, "http://"+proxy.Addr()), snsbroker.Options{
						CreateTopics: true, MaxBatchSize: 1, Logger: quiet, Topic: func(ev *core.Event) string { return topic(ev.EventType) }})
					if err != nil {
						t.Fatal(err)
					}
					sub := &Subscriber{t: t, g: g, raw: true}
					t.Cleanup(func() { sub.Close() })
					return &outboxtest.BrokerFixture{Publisher: pub, Subscriber: sub, Topic: topic}
				}
				newInbox := func(t *testing.T) *outboxtest.InboxFixture {
					in, _, _ := fixtures.InboxBackends[0].NewSQLInbox(t, true)
					return in
				}
				fault := outboxtest.Fault{
					Name:   "SNS " + mode + ": " + f.name,
					Inject: func(t *testing.T) { must(t, f.inject(proxy)) },
					Heal:   func(t *testing.T) { must(t, proxy.Heal()) },
				}
				if os.Getenv("TXOUTBOX_FAULTS") == "long" {
					fault.Duration = 30 * time.Second
				}
				rep := outboxtest.RunFault(t, newStore, newBroker, newInbox, fault, outboxtest.FaultOptions{Ordering: ordering, Rate: 50})
				rows = append(rows, rep.String())
			})
		}
	}
	t.Logf("\n%s\n%s", outboxtest.FaultTableHeader, strings.Join(rows, "\n"))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
