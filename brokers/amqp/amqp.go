// Package amqpbroker publishes txoutbox events to RabbitMQ (AMQP 0.9.1)
// through github.com/ThreeDotsLabs/watermill-amqp/v3, and gives consumers a
// Watermill subscriber bound to the same topology.
//
// Every message is persistent and goes to a durable exchange; Publish
// reports an event as published only after RabbitMQ confirmed it (publisher
// confirms), so the relay never marks an event the broker did not take.
// The event's headers (event_id, aggregate_id, aggregate_type, event_type and
// its own) travel as AMQP headers.
//
// Routing: by default each topic (the event type, or what Options.Topic
// returns) has its own durable fanout exchange of the same name. With
// Options.Exchange set, all events go to that one exchange (topic or direct)
// with the topic as routing key.
//
// Credentials, vhost and TLS come from the URL: amqps://user:pass@host:5671/vhost
// dials TLS with the system's roots; Options.TLSConfig sets a private CA or a
// client certificate. After a broker restart the connection is re-dialled
// with backoff; while it is down Publish fails fast with ErrNotConnected and
// the events stay in the outbox.
package amqpbroker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/txoutbox/core"
)

var (
	// ErrInvalidOptions is wrapped by errors that reject a configuration.
	ErrInvalidOptions = errors.New("amqpbroker: invalid options")
	// ErrNotConnected is wrapped by the error of an event published while
	// the connection to RabbitMQ is down (it is being re-dialled).
	ErrNotConnected = errors.New("amqpbroker: not connected to RabbitMQ")
	// ErrPublish is wrapped by the error of an event RabbitMQ did not take:
	// the publish failed or the broker nacked it or never confirmed it.
	ErrPublish = errors.New("amqpbroker: publish failed")
	// ErrEarlierFailed is wrapped by the error of an event that was not sent
	// because an earlier event of the same aggregate in the batch failed;
	// sending it would overtake its predecessor.
	ErrEarlierFailed = errors.New("amqpbroker: an earlier event of the aggregate failed")
)

// Exchange types for Options.ExchangeType.
const (
	ExchangeTopic  = "topic"
	ExchangeDirect = "direct"
	ExchangeFanout = "fanout"
)

// DefaultConcurrency is the default Options.Concurrency.
const DefaultConcurrency = 8

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
		return fmt.Errorf("%w: ExchangeType %q without Exchange", ErrInvalidOptions, t.ExchangeType)
	case t.Exchange != "" && t.ExchangeType != "" && t.ExchangeType != ExchangeTopic && t.ExchangeType != ExchangeDirect:
		return fmt.Errorf("%w: ExchangeType %q (want %q or %q)", ErrInvalidOptions, t.ExchangeType, ExchangeTopic, ExchangeDirect)
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

// config is the watermill-amqp configuration shared by publisher and
// subscriber, so that both declare the same durable exchange.
func (t Topology) config(url string, tlsConfig *tls.Config, reconnect *wamqp.ReconnectConfig) wamqp.Config {
	identity := func(topic string) string { return topic }
	return wamqp.Config{
		Connection: wamqp.ConnectionConfig{AmqpURI: url, TLSConfig: tlsConfig, Reconnect: reconnect},
		// DefaultMarshaler copies the metadata into AMQP headers and sets
		// DeliveryMode persistent.
		Marshaler: wamqp.DefaultMarshaler{},
		Exchange: wamqp.ExchangeConfig{
			GenerateName: t.ExchangeName,
			Type:         t.exchangeType(),
			Durable:      true,
		},
		Queue:           wamqp.QueueConfig{Durable: true},
		QueueBind:       wamqp.QueueBindConfig{GenerateRoutingKey: identity},
		Publish:         wamqp.PublishConfig{GenerateRoutingKey: identity},
		TopologyBuilder: &wamqp.DefaultTopologyBuilder{},
	}
}

// Options configures a Publisher.
type Options struct {
	// URL is the AMQP URL with credentials and vhost:
	// amqp://user:pass@host:5672/vhost, or amqps:// for TLS. Required.
	URL string
	// Topology must match the subscribers'.
	Topology
	// Topic maps an event to its topic. Default core.TopicByEventType.
	Topic core.TopicFunc
	// Consumers names consumers whose durable queues the publisher declares
	// and binds before its first publish to a topic. RabbitMQ confirms and
	// drops a message that no queue is bound to, so list the consumers that
	// must not miss events published before they first subscribed.
	Consumers []string
	// Concurrency is how many aggregates are published in parallel, each on
	// its own channel, within one Publish. Default DefaultConcurrency.
	Concurrency int
	// TLSConfig replaces the TLS configuration of an amqps:// URL (private
	// CA, client certificate). Optional.
	TLSConfig *tls.Config
	// Reconnect tunes the backoff of re-dialling after the connection
	// dropped. Default: watermill-amqp's (0.5s growing to 60s).
	Reconnect *wamqp.ReconnectConfig
	// Logger receives connection and publish logs. Default slog.Default().
	Logger *slog.Logger
}

// Publisher is a core.Publisher to RabbitMQ with publisher confirms.
type Publisher struct {
	pub       *wamqp.Publisher
	topology  Topology
	topic     core.TopicFunc
	consumers []string
	conc      int

	mu       sync.Mutex
	declared map[string]bool // topics whose consumer queues are declared
}

// NewPublisher connects to RabbitMQ and returns a Publisher. Close it to
// close the connection.
func NewPublisher(opts Options) (*Publisher, error) {
	if opts.URL == "" {
		return nil, fmt.Errorf("%w: URL is empty", ErrInvalidOptions)
	}
	if err := opts.Topology.validate(); err != nil {
		return nil, err
	}
	if opts.Concurrency < 0 {
		return nil, fmt.Errorf("%w: negative Concurrency", ErrInvalidOptions)
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.Topic == nil {
		opts.Topic = core.TopicByEventType
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	cfg := opts.Topology.config(opts.URL, opts.TLSConfig, opts.Reconnect)
	// Publish waits for the broker's ack of every message; a nack or a
	// channel that closes before the ack is an error.
	cfg.Publish.ConfirmDelivery = true
	// A pool keeps channels (each in confirm mode) open across publishes,
	// instead of opening a channel per message.
	cfg.Publish.ChannelPoolSize = opts.Concurrency
	pub, err := wamqp.NewPublisher(cfg, watermill.NewSlogLogger(opts.Logger))
	if err != nil {
		return nil, fmt.Errorf("amqpbroker: connect publisher: %w", err)
	}
	return &Publisher{
		pub:       pub,
		topology:  opts.Topology,
		topic:     opts.Topic,
		consumers: opts.Consumers,
		conc:      opts.Concurrency,
		declared:  map[string]bool{},
	}, nil
}

// Publish sends the events and returns when RabbitMQ confirmed each of them,
// with a *core.BatchError naming the ones it did not take.
//
// One aggregate's events are sent one after another, each after the previous
// one was confirmed, so they reach a queue in order; different aggregates go
// out in parallel (Options.Concurrency). When an event fails, the later
// events of its aggregate in the batch are not sent (ErrEarlierFailed).
func (p *Publisher) Publish(ctx context.Context, events []core.Event) error {
	return publishByAggregate(ctx, events, p.conc, p.publishOne)
}

func (p *Publisher) publishOne(ctx context.Context, ev *core.Event) error {
	topic := p.topic(ev)
	if topic == "" {
		return fmt.Errorf("%w: no topic for %s event %s", core.ErrInvalidEvent, ev.EventType, ev.ID)
	}
	if !p.pub.IsConnected() {
		return fmt.Errorf("%w: event %s", ErrNotConnected, ev.ID)
	}
	if err := p.declareQueues(topic); err != nil {
		return fmt.Errorf("%w: event %s: declare consumer queues of %q: %w", ErrPublish, ev.ID, topic, err)
	}
	if err := p.pub.Publish(topic, core.NewMessage(ctx, ev)); err != nil {
		return fmt.Errorf("%w: %s event %s to exchange %q: %w", ErrPublish, ev.EventType, ev.ID, p.topology.ExchangeName(topic), err)
	}
	return nil
}

// declareQueues declares and binds the Consumers' queues of topic once, the
// same way their subscribers do.
func (p *Publisher) declareQueues(topic string) error {
	if len(p.consumers) == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.declared[topic] {
		return nil
	}
	ch, err := p.pub.Connection().Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	exchange := p.topology.ExchangeName(topic)
	if err := ch.ExchangeDeclare(exchange, p.topology.exchangeType(), true, false, false, false, nil); err != nil {
		return err
	}
	for _, c := range p.consumers {
		q := QueueName(c, topic)
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			return err
		}
		if err := ch.QueueBind(q, topic, exchange, false, nil); err != nil {
			return err
		}
	}
	p.declared[topic] = true
	return nil
}

// Close closes the publisher's channels and connection.
func (p *Publisher) Close() error { return p.pub.Close() }

// Watermill returns the underlying watermill-amqp publisher, for code that
// publishes Watermill messages next to the relay.
func (p *Publisher) Watermill() *wamqp.Publisher { return p.pub }

// SubscriberOptions configures NewSubscriber.
type SubscriberOptions struct {
	// URL is the AMQP URL, as in Options. Required.
	URL string
	// Topology must match the publisher's.
	Topology
	// Consumer names the consumer group: Subscribe(ctx, topic) consumes the
	// durable queue QueueName(Consumer, topic), bound to the topic's
	// exchange with the topic as binding key (with a topic exchange,
	// "order.*" is a pattern). Instances with the same Consumer share the
	// work. Required.
	Consumer string
	// Prefetch is how many unacknowledged messages RabbitMQ hands to one
	// subscription. Default 16.
	Prefetch int
	// TLSConfig and Reconnect are as in Options.
	TLSConfig *tls.Config
	Reconnect *wamqp.ReconnectConfig
	// Logger receives the subscriber's logs. Default slog.Default().
	Logger *slog.Logger
}

// NewSubscriber connects to RabbitMQ and returns a Watermill subscriber
// that consumes what a Publisher with the same Topology sent. It re-dials
// and resumes consuming after the broker restarts. Messages carry the
// event's headers as metadata and the event ID as UUID; a nacked message is
// requeued.
func NewSubscriber(opts SubscriberOptions) (*wamqp.Subscriber, error) {
	if opts.URL == "" {
		return nil, fmt.Errorf("%w: URL is empty", ErrInvalidOptions)
	}
	if opts.Consumer == "" {
		return nil, fmt.Errorf("%w: Consumer is empty", ErrInvalidOptions)
	}
	if err := opts.Topology.validate(); err != nil {
		return nil, err
	}
	if opts.Prefetch < 0 {
		return nil, fmt.Errorf("%w: negative Prefetch", ErrInvalidOptions)
	}
	if opts.Prefetch == 0 {
		opts.Prefetch = 16
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	cfg := opts.Topology.config(opts.URL, opts.TLSConfig, opts.Reconnect)
	consumer := opts.Consumer
	cfg.Queue.GenerateName = func(topic string) string { return QueueName(consumer, topic) }
	cfg.Consume.Qos.PrefetchCount = opts.Prefetch
	sub, err := wamqp.NewSubscriber(cfg, watermill.NewSlogLogger(opts.Logger))
	if err != nil {
		return nil, fmt.Errorf("amqpbroker: connect subscriber: %w", err)
	}
	return sub, nil
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
