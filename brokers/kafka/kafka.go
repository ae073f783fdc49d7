// Package kafkabroker publishes txoutbox events to Kafka with
// github.com/IBM/sarama, in watermill-kafka's record format, and gives
// consumers a github.com/ThreeDotsLabs/watermill-kafka/v3 consumer-group
// subscriber.
//
// The topic is the event type, or what Options.Topic returns (TopicMap
// renames some). The message key is the aggregate ID, so that one
// aggregate's events land on one partition, in order; the Publisher reports
// so (core.PublisherCapabilities), which turns on the relay's ordered mode under
// core.OrderingAuto. The producer waits for all in-sync replicas (acks=all)
// and is idempotent, so a retry inside the client does not write a record
// twice. The event's headers (event_id,
// aggregate_id, ...) travel as Kafka record headers.
//
// TLS and SASL are sarama settings: pass a *sarama.Config from
// NewSaramaConfig with Net.TLS / Net.SASL filled in as Options.Sarama.
package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txoutbox/txoutbox/brokers/cloudevent"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
)

var (
	// ErrPublish is wrapped by the error of an event Kafka did not take.
	ErrPublish = errors.New("kafkabroker: publish failed")
)

// defaultVersion is the Kafka protocol version NewSaramaConfig asks for:
// recent enough for the idempotent producer (0.11+) and record headers.
var defaultVersion = sarama.V3_6_0_0

// NewSaramaConfig returns the sarama configuration the publisher and the
// subscriber start from: Kafka protocol 3.6 (lower Version for an older
// cluster; 0.11 is the minimum), and the producer settings that
// NewPublisher enforces anyway. Set TLS, SASL or client ID on it and pass it
// as Options.Sarama / SubscriberOptions.Sarama.
func NewSaramaConfig() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = defaultVersion
	cfg.ClientID = "txoutbox"
	producerSafety(cfg)
	cfg.Consumer.Return.Errors = true
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	return cfg
}

// producerSafety sets what an outbox needs from the producer.
func producerSafety(cfg *sarama.Config) {
	// A record counts as written once every in-sync replica has it.
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	// Retries inside sarama reuse the sequence number, so the broker drops
	// the second copy instead of appending it. The idempotent producer
	// needs one request in flight per broker connection.
	cfg.Producer.Idempotent = true
	cfg.Net.MaxOpenRequests = 1
	// The idempotent producer needs at least one retry.
	if cfg.Producer.Retry.Max < 1 {
		cfg.Producer.Retry.Max = 3
	}
	cfg.Producer.Return.Successes = true
	cfg.Producer.Return.Errors = true
	// The default hash partitioner maps a key to a fixed partition.
	cfg.Producer.Partitioner = sarama.NewHashPartitioner
}

// TopicMap returns a TopicFunc that looks the event type up in m and falls
// back to the event type itself.
func TopicMap(m map[string]string) core.TopicFunc {
	return func(ev *core.Event) string {
		if t, ok := m[ev.EventType]; ok {
			return t
		}
		return ev.EventType
	}
}

// Options configures a Publisher.
type Options struct {
	// Brokers are the bootstrap addresses ("host:9092"). Required.
	Brokers []string
	// Topic maps an event to its topic. Default core.TopicByEventType; see
	// TopicMap.
	Topic core.TopicFunc
	// Sarama is the client configuration. Default NewSaramaConfig(). The
	// publisher overrides the producer's acks, idempotence, in-flight
	// requests, partitioner and return settings (see NewSaramaConfig); a
	// Version below 0.11 is rejected.
	Sarama *sarama.Config
	// CloudEvents, when set, sends events as CloudEvents 1.0 (Kafka
	// binding: "ce_" headers and content-type in binary mode).
	CloudEvents *cloudevent.Options
}

// Publisher is a core.Publisher to Kafka with acks=all and an idempotent
// producer. Records are encoded by Marshaler (watermill-kafka's format), so
// Watermill subscribers read them as messages whose UUID is the event ID.
type Publisher struct {
	producer sarama.AsyncProducer
	maxBytes int // the producer's MaxMessageBytes
	topic    core.TopicFunc
	marshal  Marshaler
	ce       *cloudevent.Options
	drained  chan struct{} // closed when route has seen the producer's last outcome

	// mu guards closed: sending on the producer's Input after AsyncClose
	// would panic, so Publish sends under the read lock and Close takes the
	// write lock.
	mu     sync.RWMutex
	closed bool
}

// slot is a record's Metadata: where route sends its outcome. acks has room
// for the whole batch, so route never waits on a Publish that gave up.
type slot struct {
	acks chan<- ack
	i    int // index of the event in the Publish call
}

type ack struct {
	i   int
	err error
}

var _ core.Publisher = (*Publisher)(nil)

// NewPublisher connects to Kafka and returns a Publisher. Close it to close
// the producer.
func NewPublisher(opts Options) (*Publisher, error) {
	if len(opts.Brokers) == 0 {
		return nil, fmt.Errorf("%w: no Brokers", core.ErrInvalidOptions)
	}
	if opts.Topic == nil {
		opts.Topic = core.TopicByEventType
	}
	if opts.CloudEvents != nil {
		if err := opts.CloudEvents.Validate(); err != nil {
			return nil, err
		}
	}
	cfg := opts.Sarama
	if cfg == nil {
		cfg = NewSaramaConfig()
	}
	if !cfg.Version.IsAtLeast(sarama.V0_11_0_0) {
		return nil, fmt.Errorf("%w: Kafka version %s is too old for the idempotent producer (0.11+)", core.ErrInvalidOptions, cfg.Version)
	}
	producerSafety(cfg)
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: sarama: %w", core.ErrInvalidOptions, err)
	}
	// watermill-kafka's Publisher sends one record per round trip
	// (SendMessage in a loop); a batch goes out together instead. The
	// asynchronous producer (which sarama's SyncProducer wraps) lets Publish
	// stop waiting when its context ends, which SendMessages cannot.
	producer, err := sarama.NewAsyncProducer(opts.Brokers, cfg)
	if err != nil {
		return nil, fmt.Errorf("kafkabroker: connect producer: %w", err)
	}
	p := &Publisher{producer: producer, maxBytes: cfg.Producer.MaxMessageBytes, topic: opts.Topic, ce: opts.CloudEvents, drained: make(chan struct{})}
	go p.route()
	return p, nil
}

// route hands each record's outcome to the Publish call that sent it, until
// the producer has closed both of its channels.
func (p *Publisher) route() {
	defer close(p.drained)
	successes, errs := p.producer.Successes(), p.producer.Errors()
	for successes != nil || errs != nil {
		select {
		case m, ok := <-successes:
			if !ok {
				successes = nil
				continue
			}
			if s, ok := m.Metadata.(slot); ok {
				s.acks <- ack{i: s.i}
			}
		case pe, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			if s, ok := pe.Msg.Metadata.(slot); ok {
				s.acks <- ack{i: s.i, err: pe.Err}
			}
		}
	}
}

// Publish sends the events in one batch and returns when Kafka acknowledged
// each of them (acks=all), with a *core.BatchError naming the ones it did not
// take. If ctx ends first, Publish returns at once and names the records
// not yet acknowledged as failed, wrapping ctx's error; Kafka may still
// write them, and the relay's retry then makes a duplicate, which the
// consumer's inbox absorbs.
//
// Records of one aggregate go to one partition in the order of the batch:
// sarama keeps the order of a partition's records, and the idempotent
// producer keeps it across its retries.
func (p *Publisher) Publish(ctx context.Context, events []core.Event) error {
	if len(events) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return fmt.Errorf("%w: kafkabroker: publisher closed", core.ErrClosed)
	}
	be := core.NewBatchError(len(events))
	acks := make(chan ack, len(events))
	waiting := make(map[int]bool, len(events))
	for i := range events {
		ev := &events[i]
		topic := p.topic(ev)
		if err := validTopic(topic); err != nil {
			be.Errs[i] = core.Permanent(fmt.Errorf("%w: %s event %s: %w", core.ErrInvalidEvent, ev.EventType, ev.ID, err))
			continue
		}
		msg := watermillbroker.NewMessage(ctx, ev)
		if p.ce != nil {
			var err error
			if msg, _, err = p.ce.NewMessage(ctx, ev, cloudevent.Kafka); err != nil {
				be.Errs[i] = core.Permanent(fmt.Errorf("%w: %w", ErrPublish, err))
				continue
			}
		}
		rec, err := p.marshal.Marshal(topic, msg)
		if err != nil {
			be.Errs[i] = fmt.Errorf("%w: marshal event %s: %w", ErrPublish, ev.ID, err)
			continue
		}
		// sarama refuses a record above MaxMessageBytes too, but only
		// after it entered the producer; refusing it here names the size.
		if size := recordSize(rec); size > p.maxBytes {
			be.Errs[i] = core.Permanent(fmt.Errorf("%w: %s event %s is about %d bytes as a Kafka record, above the producer's MaxMessageBytes %d: %w",
				ErrPublish, ev.EventType, ev.ID, size, p.maxBytes, sarama.ErrMessageSizeTooLarge))
			continue
		}
		rec.Metadata = slot{acks: acks, i: i}
		select {
		case p.producer.Input() <- rec:
			waiting[i] = true
		case <-ctx.Done():
			for k := i; k < len(events); k++ {
				be.Errs[k] = fmt.Errorf("%w: %s event %s not sent: %w", ErrPublish, events[k].EventType, events[k].ID, ctx.Err())
			}
			return p.await(ctx, events, acks, waiting, be)
		}
	}
	return p.await(ctx, events, acks, waiting, be)
}

// await collects the outcomes of the records in waiting, until all came or
// ctx ends.
func (p *Publisher) await(ctx context.Context, events []core.Event, acks <-chan ack, waiting map[int]bool, be *core.BatchError) error {
	for len(waiting) > 0 {
		select {
		case a := <-acks:
			delete(waiting, a.i)
			if a.err != nil {
				ev := &events[a.i]
				err := fmt.Errorf("%w: %s event %s to topic %q: %w", ErrPublish, ev.EventType, ev.ID, p.topic(ev), a.err)
				if refusedForGood(a.err) {
					err = core.Permanent(err)
				}
				be.Errs[a.i] = err
			}
		case <-ctx.Done():
			for i := range waiting {
				be.Errs[i] = fmt.Errorf("%w: %s event %s: no acknowledgement before the context ended: %w", ErrPublish, events[i].EventType, events[i].ID, ctx.Err())
			}
			return be.ErrOrNil()
		}
	}
	return be.ErrOrNil()
}

// refusedForGood reports whether Kafka (or sarama) refused a record in a
// way that sending it again cannot change.
func refusedForGood(err error) bool {
	for _, kerr := range []sarama.KError{sarama.ErrMessageSizeTooLarge, sarama.ErrInvalidTopic, sarama.ErrMessageSetSizeTooLarge,
		sarama.ErrInvalidRecord, sarama.ErrTopicAuthorizationFailed} {
		if errors.Is(err, kerr) {
			return true
		}
	}
	return false
}

// MaxTopicLength is the longest topic name Kafka accepts.
const MaxTopicLength = 249

// validTopic applies Kafka's rules for topic names: 1 to 249 of
// [a-zA-Z0-9._-], and not "." or "..".
func validTopic(t string) error {
	switch {
	case t == "":
		return errors.New("no topic")
	case len(t) > MaxTopicLength:
		return fmt.Errorf("topic %.32q… is %d bytes, Kafka takes %d", t, len(t), MaxTopicLength)
	case t == "." || t == "..":
		return fmt.Errorf("topic %q is not a legal name", t)
	}
	for _, c := range []byte(t) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic %.64q has a character Kafka refuses (%q; it takes a-z A-Z 0-9 . _ -)", t, c)
		}
	}
	return nil
}

// recordSize estimates a record's size on the wire as sarama counts it
// against MaxMessageBytes: key, value, headers and the fixed overhead.
func recordSize(rec *sarama.ProducerMessage) int {
	n := 70 // record batch and record overhead, generously
	if rec.Key != nil {
		n += rec.Key.Length()
	}
	if rec.Value != nil {
		n += rec.Value.Length()
	}
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value) + 10
	}
	return n
}

// Capabilities implements core.Publisher: PreservesAggregateOrder, so that
// a relay with the default core.OrderingAuto runs in ordered mode. The record key is the aggregate ID and the partitioner
// hashes it (NewPublisher enforces both), so an aggregate's events of one
// topic land on one partition; the idempotent producer with one request in
// flight keeps a partition's order across sarama's retries, and a batch's
// records enter the producer in the batch's order. Order holds per topic: events of one
// aggregate that Options.Topic sends to different topics are ordered within
// each topic only. Events without an aggregate ID have no key and no order.
func (p *Publisher) Capabilities() core.PublisherCapabilities {
	return core.PublisherCapabilities{PreservesAggregateOrder: true}
}

// Close flushes and closes the producer: it waits for the records in flight
// (sarama's own timeouts and retries bound that).
func (p *Publisher) Close() error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.producer.AsyncClose()
	}
	p.mu.Unlock()
	<-p.drained
	return nil
}

// Marshaler is watermill-kafka's DefaultMarshaler (metadata as record
// headers) with the aggregate ID as the record key. Events without an
// aggregate get no key and are spread over the partitions.
type Marshaler struct{ wkafka.DefaultMarshaler }

// Marshal converts a Watermill message to a sarama record.
func (m Marshaler) Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	rec, err := m.DefaultMarshaler.Marshal(topic, msg)
	if err != nil {
		return nil, err
	}
	if key := msg.Metadata.Get(core.HeaderAggregateID); key != "" {
		rec.Key = sarama.StringEncoder(key)
	}
	return rec, nil
}

// SubscriberOptions configures NewSubscriber.
type SubscriberOptions struct {
	// Brokers are the bootstrap addresses. Required.
	Brokers []string
	// ConsumerGroup is the Kafka consumer group: instances with the same
	// group share the partitions, and the group's committed offsets say
	// where a restarted consumer resumes. Required.
	ConsumerGroup string
	// Sarama is the client configuration. Default NewSaramaConfig(), which
	// starts a new group at the oldest offset so that nothing published
	// before the group's first subscription is missed.
	Sarama *sarama.Config
	// ReconnectRetrySleep is the pause before re-joining the group after the
	// connection failed. Default 1s.
	ReconnectRetrySleep time.Duration
	// Logger receives the client's logs. Default slog.Default().
	Logger *slog.Logger
}

// NewSubscriber returns a Watermill subscriber that consumes topics as one
// consumer group. Messages carry the record headers as metadata and the
// event ID as UUID; an acked message's offset is committed, a nacked one is
// redelivered.
//
// It returns watermill-kafka's own *Subscriber, not a type of ours: it is
// the message.Subscriber a Watermill router takes, configured with this
// package's Marshaler and sarama settings, and a wrapper would add a layer
// without adding a method. (The RabbitMQ subscriber is ours because it adds
// the consumer-group topology on top of watermill-amqp.)
func NewSubscriber(opts SubscriberOptions) (*wkafka.Subscriber, error) {
	if len(opts.Brokers) == 0 {
		return nil, fmt.Errorf("%w: no Brokers", core.ErrInvalidOptions)
	}
	if opts.ConsumerGroup == "" {
		return nil, fmt.Errorf("%w: ConsumerGroup is empty", core.ErrInvalidOptions)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	cfg := opts.Sarama
	if cfg == nil {
		cfg = NewSaramaConfig()
	}
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               opts.Brokers,
		Unmarshaler:           Marshaler{},
		OverwriteSaramaConfig: cfg,
		ConsumerGroup:         opts.ConsumerGroup,
		ReconnectRetrySleep:   opts.ReconnectRetrySleep,
	}, watermill.NewSlogLogger(opts.Logger))
	if err != nil {
		return nil, fmt.Errorf("kafkabroker: subscriber: %w", err)
	}
	return sub, nil
}
