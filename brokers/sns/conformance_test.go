package snsbroker_test

import (
	"encoding/json"
	"strings"
	"testing"

	snsbroker "github.com/txoutbox/txoutbox/brokers/sns"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/sqstest"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// fixtureKind is one way of running the conformance suite on goaws.
type fixtureKind struct {
	raw   bool // RawMessageDelivery on the SQS subscription
	fifo  bool // FIFO topic and queue
	batch bool // PublishBatch through front, else Publish to goaws
}

func newFixture(k fixtureKind) outboxtest.NewBrokerFunc {
	return func(t *testing.T) *outboxtest.BrokerFixture {
		g := sqstest.New(t)
		topic := func(eventType string) string {
			if k.fifo {
				return snsbroker.TopicName(eventType) + ".fifo"
			}
			return snsbroker.TopicName(eventType)
		}
		client := g.SNS
		opts := snsbroker.Options{CreateTopics: true, MaxBatchSize: 1, Logger: quiet, Topic: func(ev *core.Event) string { return topic(ev.EventType) }}
		if k.batch {
			client = newSNSClient(t, newFront(t, g.Endpoint).URL())
			opts.MaxBatchSize = 0 // default: 10
		}
		pub, err := snsbroker.NewPublisher(client, opts)
		if err != nil {
			t.Fatal(err)
		}
		sub := &sqstest.Subscriber{T: t, G: g, Raw: k.raw}
		t.Cleanup(func() { sub.Close() })
		return &outboxtest.BrokerFixture{Publisher: pub, Subscriber: sub, Topic: topic, Poison: tooLarge}
	}
}

func TestConformance(t *testing.T) {
	for name, k := range map[string]fixtureKind{
		"Envelope":          {},
		"Raw":               {raw: true},
		"FIFO":              {raw: true, fifo: true},
		"Batch":             {batch: true},
		"BatchRaw":          {batch: true, raw: true},
		"BatchFIFO":         {batch: true, fifo: true, raw: true},
		"BatchFIFOEnvelope": {batch: true, fifo: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			outboxtest.RunPublisher(t, newFixture(k))
		})
	}
}

// tooLarge is the event SNS cannot carry: a body over MaxMessageBytes. (A
// header key too long for an attribute name is no poison here: it travels
// in the overflow attribute.)
func tooLarge(ev core.Event) core.Event {
	ev.Payload = json.RawMessage(`"` + strings.Repeat("x", snsbroker.MaxMessageBytes) + `"`)
	return ev
}
