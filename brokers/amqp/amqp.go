// Package amqpbroker publishes txoutbox events to RabbitMQ (AMQP 0.9.1) and
// gives consumers a Watermill subscriber bound to the same topology.
//
// Every message is persistent and goes to a durable exchange; Publish
// reports an event as published only after RabbitMQ confirmed it (publisher
// confirms), so the relay never marks an event the broker did not take.
// Messages are mandatory: one that no queue would receive fails with
// ErrUnroutable instead of being dropped. The event's headers (event_id,
// aggregate_id, aggregate_type, event_type and its own) travel as AMQP
// string headers, encoded by watermill-amqp's DefaultMarshaler so that any
// watermill-amqp subscriber reads them too.
//
// Routing: by default each topic (the event type, or what Options.Topic
// returns) has its own durable fanout exchange of the same name. With
// Topology.Exchange set, all events go to that one exchange (topic or
// direct) with the topic as routing key. A consumer group is a durable
// queue, QueueName(consumer, topic), bound to the topic's exchange.
//
// Credentials, vhost and TLS come from the URL:
// amqps://user:pass@host:5671/vhost dials TLS with the system's roots;
// Options.TLSConfig sets a private CA or a client certificate. After the
// broker restarts, publisher and subscriber re-dial with backoff; while the
// connection is down Publish fails fast with ErrNotConnected and the events
// stay in the outbox.
package amqpbroker

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/txoutbox/txoutbox/core"
)

var (
	// ErrNotConnected is wrapped by the error of an event published while
	// the connection to RabbitMQ is down (it is being re-dialled).
	ErrNotConnected = errors.New("amqpbroker: not connected to RabbitMQ")
	// ErrPublish is wrapped by the error of an event RabbitMQ did not take:
	// the publish failed or the broker nacked it or never confirmed it.
	ErrPublish = errors.New("amqpbroker: publish failed")
	// ErrNacked is wrapped by the error of an event RabbitMQ refused with a
	// basic.nack (an internal error, or a full queue with
	// x-overflow=reject-publish).
	ErrNacked = errors.New("amqpbroker: RabbitMQ nacked the message")
	// ErrUnroutable is wrapped by the error of an event that RabbitMQ could
	// route to no queue: no queue is bound to its exchange and routing key.
	// Declare the consumers' queues with Options.Consumers (?consumers= on
	// the CLI), or bind one, or set Options.AllowUnroutable.
	ErrUnroutable = errors.New("amqpbroker: message routed to no queue")
)

// Exchange types for Options.ExchangeType.
const (
	ExchangeTopic  = "topic"
	ExchangeDirect = "direct"
	ExchangeFanout = "fanout"
)

// Topology says where messages go. The publisher and the subscribers of one
// system must use the same Topology.
type Topology struct {
	// Exchange, when set, is the single durable exchange every event goes to,
	// with the topic as routing key. When empty, each topic gets a durable
	// fanout exchange named after it.
	Exchange string
	// ExchangeType is the type of Exchange: ExchangeTopic (default) or
	// ExchangeDirect. It must be empty when Exchange is.
	ExchangeType string
}

func (t Topology) validate() error {
	switch {
	case t.Exchange == "" && t.ExchangeType != "":
		return fmt.Errorf("%w: ExchangeType %q without Exchange", core.ErrInvalidOptions, t.ExchangeType)
	case t.Exchange != "" && t.ExchangeType != "" && t.ExchangeType != ExchangeTopic && t.ExchangeType != ExchangeDirect:
		return fmt.Errorf("%w: ExchangeType %q (want %q or %q)", core.ErrInvalidOptions, t.ExchangeType, ExchangeTopic, ExchangeDirect)
	}
	return nil
}

// ExchangeName returns the exchange that messages of topic go to.
func (t Topology) ExchangeName(topic string) string {
	if t.Exchange != "" {
		return t.Exchange
	}
	return topic
}

func (t Topology) exchangeType() string {
	switch {
	case t.Exchange == "":
		return ExchangeFanout
	case t.ExchangeType == "":
		return ExchangeTopic
	default:
		return t.ExchangeType
	}
}

// QueueName is the durable queue of one consumer (a consumer group: every
// instance with the same name shares the queue) for one topic.
func QueueName(consumer, topic string) string { return consumer + "." + topic }

// declare declares topic's durable exchange on ch.
func (t Topology) declare(ch *amqp.Channel, topic string) (exchange string, err error) {
	exchange = t.ExchangeName(topic)
	if err := ch.ExchangeDeclare(exchange, t.exchangeType(), true, false, false, false, nil); err != nil {
		return "", fmt.Errorf("declare exchange %q: %w", exchange, err)
	}
	return exchange, nil
}

// declareQueue declares consumer's durable queue of topic on ch and binds
// it to the topic's exchange with the topic as binding key.
func (t Topology) declareQueue(ch *amqp.Channel, consumer, topic string) (queue string, err error) {
	exchange, err := t.declare(ch, topic)
	if err != nil {
		return "", err
	}
	queue = QueueName(consumer, topic)
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return "", fmt.Errorf("declare queue %q: %w", queue, err)
	}
	if err := ch.QueueBind(queue, topic, exchange, false, nil); err != nil {
		return "", fmt.Errorf("bind queue %q to %q: %w", queue, exchange, err)
	}
	return queue, nil
}

// Table converts the AMQP headers of a delivery to strings, for consumers
// that read deliveries with amqp091-go directly.
func Table(h amqp.Table) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if s, ok := v.(string); ok {
			out[k] = s
		}
	}
	return out
}
