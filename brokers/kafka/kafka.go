// Package kafkabroker publishes txoutbox events to Kafka with franz-go
// (github.com/twmb/franz-go), in watermill-kafka's record format, and gives
// consumers a Watermill consumer-group subscriber that reads it.
//
// The topic is the event type, or what Options.Topic returns (TopicMap
// renames some). The record key is the aggregate ID, hashed to a partition
// as sarama and watermill-kafka hash it, so that one aggregate's events land
// on one partition, in order; the Publisher reports so
// (core.PublisherCapabilities), which turns on the relay's ordered mode
// under core.OrderingAuto. The producer waits for all in-sync replicas
// (acks=all) and is idempotent, so a retry inside the client does not write
// a record twice. The event's headers (event_id, aggregate_id, ...) travel
// as Kafka record headers.
//
// With Options.Transactional, a log-mode relay (packages logrelay and
// binlogrelay) publishes each batch in a Kafka transaction together with
// the log position it ends at: a consumer that reads with
// isolation.level=read_committed then sees each event once, even when the
// relay is killed (docs/kafka-exactly-once.md).
//
// TLS, SASL and the client's timeouts are franz-go options: pass them as
// Options.Client (kgo.DialTLSConfig, kgo.SASL, ...).
package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/txoutbox/brokers/cloudevent"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
)

var (
	// ErrPublish is wrapped by the error of an event Kafka did not take.
	ErrPublish = errors.New("kafkabroker: publish failed")
)

// DefaultMaxRecordBytes is Options.MaxRecordBytes' default: Kafka's own
// default limit on a record batch (message.max.bytes).
const DefaultMaxRecordBytes = 1 << 20

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
	// Client are further franz-go options: TLS (kgo.DialTLSConfig), SASL
	// (kgo.SASL), kgo.ClientID, timeouts. The publisher applies its own
	// after them: acks from every in-sync replica, the partitioner that
	// hashes the key, MaxRecordBytes and, with Transactional, the
	// transactional ID. An option that turns idempotence off is refused.
	Client []kgo.Opt
	// MaxRecordBytes is the largest record the publisher sends: a larger
	// event fails for good (it is dead-lettered) instead of being retried.
	// Keep it at most the topic's max.message.bytes. Default
	// DefaultMaxRecordBytes.
	MaxRecordBytes int
	// CloudEvents, when set, sends events as CloudEvents 1.0 (Kafka
	// binding: "ce_" headers and content-type in binary mode).
	CloudEvents *cloudevent.Options
	// Transactional, when set, lets a log-mode relay publish exactly once
	// for read_committed consumers: each batch it publishes is one Kafka
	// transaction, with the log position the batch ends at. Nil: plain
	// idempotent publishing only.
	Transactional *Transactional
}

// Publisher is a core.Publisher to Kafka with acks=all and an idempotent
// producer. Records are in watermill-kafka's format (see NewSubscriber), so
// Watermill subscribers read them as messages whose UUID is the event ID.
type Publisher struct {
	opts Options
	base []kgo.Opt // the client options, in order

	// rw guards closed and cl, the plain client: Publish holds the read
	// lock, Close the write lock.
	rw     sync.RWMutex
	cl     *kgo.Client
	closed bool
	// mu guards tx, the transactional client (Options.Transactional),
	// and makes one transaction at a time: a Publish with a position and
	// CommittedPosition hold it for their whole call.
	mu sync.Mutex
	tx *kgo.Client
}

var _ core.Publisher = (*Publisher)(nil)

// NewPublisher checks opts, connects to Kafka and returns a Publisher. Close
// it to flush and close the client. In transactional mode it also takes the
// transactional ID, which fences a producer that held it before.
func NewPublisher(opts Options) (*Publisher, error) {
	if len(opts.Brokers) == 0 {
		return nil, fmt.Errorf("%w: no Brokers", core.ErrInvalidOptions)
	}
	if opts.Topic == nil {
		opts.Topic = core.TopicByEventType
	}
	if opts.MaxRecordBytes < 0 {
		return nil, fmt.Errorf("%w: kafkabroker: MaxRecordBytes %d is negative", core.ErrInvalidOptions, opts.MaxRecordBytes)
	}
	if opts.MaxRecordBytes == 0 {
		opts.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if opts.CloudEvents != nil {
		if err := opts.CloudEvents.Validate(); err != nil {
			return nil, err
		}
	}
	if opts.Transactional != nil {
		if err := opts.Transactional.check(); err != nil {
			return nil, err
		}
	}
	base := []kgo.Opt{
		kgo.SeedBrokers(opts.Brokers...),
		kgo.ClientID("txoutbox"),
		// sarama's default, which the module's users had: a topic appears
		// when first written to, where the cluster allows it.
		kgo.AllowAutoTopicCreation(),
		// Java's delivery.timeout.ms: a record the cluster has not taken
		// by then fails, even under a context without a deadline.
		kgo.RecordDeliveryTimeout(2 * time.Minute),
	}
	base = append(base, opts.Client...)
	base = append(base,
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a))),
		kgo.ProducerBatchMaxBytes(int32(opts.MaxRecordBytes)),
	)
	p := &Publisher{opts: opts, base: base}
	cl, err := p.connect(false)
	if err != nil {
		return nil, err
	}
	// The client connects lazily; a first request here reports an
	// unreachable cluster or refused credentials now rather than at the
	// first publish.
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if err := cl.Ping(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("kafkabroker: connect to %v: %w", opts.Brokers, err)
	}
	if err := p.startTransactional(cl); err != nil {
		cl.Close()
		return nil, err
	}
	p.cl = cl
	return p, nil
}

// connect makes a client from the publisher's options: the transactional
// one, or the plain one.
func (p *Publisher) connect(transactional bool) (*kgo.Client, error) {
	opts := p.base
	if t := p.opts.Transactional; t != nil && transactional {
		opts = append(opts[:len(opts):len(opts)], kgo.TransactionalID(t.ID), kgo.TransactionTimeout(t.Timeout))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafkabroker: %w", core.ErrInvalidOptions, err)
	}
	if off, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		cl.Close()
		return nil, fmt.Errorf("%w: kafkabroker: kgo.DisableIdempotentWrite: the outbox needs the idempotent producer, or a retry inside the client writes a record twice", core.ErrInvalidOptions)
	}
	return cl, nil
}

// connectTimeout bounds NewPublisher's first request.
const connectTimeout = 30 * time.Second

// fnv32a is the hash sarama's default partitioner (and so watermill-kafka's)
// gives a key: records keep the partitions they had with those clients.
func fnv32a(b []byte) uint32 {
	h := fnv.New32a()
	h.Write(b)
	return h.Sum32()
}

// record is one event as a Kafka record, or the reason it cannot be one.
func (p *Publisher) record(ctx context.Context, ev *core.Event) (*kgo.Record, error) {
	topic := p.opts.Topic(ev)
	if err := validTopic(topic); err != nil {
		return nil, core.Permanent(fmt.Errorf("%w: %s event %s: %w", core.ErrInvalidEvent, ev.EventType, ev.ID, err))
	}
	msg := watermillbroker.NewMessage(ctx, ev)
	if p.opts.CloudEvents != nil {
		var err error
		if msg, _, err = p.opts.CloudEvents.NewMessage(ctx, ev, cloudevent.Kafka); err != nil {
			return nil, core.Permanent(fmt.Errorf("%w: %w", ErrPublish, err))
		}
	}
	rec, err := Marshal(topic, msg)
	if err != nil {
		return nil, core.Permanent(fmt.Errorf("%w: marshal event %s: %w", ErrPublish, ev.ID, err))
	}
	// The client refuses such a record too, but only once it is buffered;
	// refusing it here names the size.
	if size := recordSize(rec); size > p.opts.MaxRecordBytes {
		return nil, core.Permanent(fmt.Errorf("%w: %s event %s is about %d bytes as a Kafka record, above MaxRecordBytes %d: %w",
			ErrPublish, ev.EventType, ev.ID, size, p.opts.MaxRecordBytes, kerr.MessageTooLarge))
	}
	return rec, nil
}

// Publish sends the events in one batch and returns when Kafka acknowledged
// each of them (acks=all), with a *core.BatchError naming the ones it did
// not take. If ctx ends first, Publish returns at once and names the
// records not yet acknowledged as failed, wrapping ctx's error; Kafka may
// still write them, and the relay's retry then makes a duplicate, which the
// consumer's inbox absorbs.
//
// With Options.Transactional, a Publish whose ctx carries a log position
// (core.WithPosition), as a log-mode relay's does, is one transaction with
// the events and the position, which CommittedPosition reads back: a
// read_committed consumer sees all of it or none. Other publishes (the
// table's retry path) are plain.
//
// Records of one aggregate go to one partition in the order of the batch:
// the idempotent producer keeps a partition's order across its retries.
func (p *Publisher) Publish(ctx context.Context, events []core.Event) error {
	if len(events) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if pos, ok := core.PositionOf(ctx); ok && p.opts.Transactional != nil {
		return p.publishTx(ctx, events, pos)
	}
	p.rw.RLock()
	defer p.rw.RUnlock()
	if p.closed {
		return fmt.Errorf("%w: kafkabroker: publisher closed", core.ErrClosed)
	}
	be := core.NewBatchError(len(events))
	acks := make(chan ack, len(events))
	waiting := make(map[int]bool, len(events))
	for i := range events {
		rec, err := p.record(ctx, &events[i])
		if err != nil {
			be.Errs[i] = err
			continue
		}
		waiting[i] = true
		p.cl.Produce(ctx, rec, func(_ *kgo.Record, err error) { acks <- ack{i: i, err: err} })
	}
	return p.await(ctx, events, acks, waiting, be)
}

type ack struct {
	i   int
	err error
}

// await collects the outcomes of the records in waiting, until all came or
// ctx ends.
func (p *Publisher) await(ctx context.Context, events []core.Event, acks <-chan ack, waiting map[int]bool, be *core.BatchError) error {
	for len(waiting) > 0 {
		select {
		case a := <-acks:
			delete(waiting, a.i)
			if a.err != nil {
				be.Errs[a.i] = p.failed(&events[a.i], a.err)
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

// failed wraps the error Kafka gave an event's record.
func (p *Publisher) failed(ev *core.Event, err error) error {
	err = fmt.Errorf("%w: %s event %s to topic %q: %w", ErrPublish, ev.EventType, ev.ID, p.opts.Topic(ev), err)
	if refusedForGood(err) {
		err = core.Permanent(err)
	}
	return err
}

// refusedForGood reports whether Kafka refused a record in a way that
// sending it again cannot change.
func refusedForGood(err error) bool {
	for _, kind := range []error{kerr.MessageTooLarge, kerr.InvalidTopicException, kerr.RecordListTooLarge,
		kerr.InvalidRecord, kerr.TopicAuthorizationFailed} {
		if errors.Is(err, kind) {
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

// recordSize estimates a record's size in a batch of its own, as Kafka
// counts it against the batch limit: key, value, headers and the fixed
// overhead.
func recordSize(rec *kgo.Record) int {
	n := 70 // record batch and record overhead, generously
	n += len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value) + 10
	}
	return n
}

// Capabilities implements core.Publisher: PreservesAggregateOrder, so that
// a relay with the default core.OrderingAuto runs in ordered mode. The
// record key is the aggregate ID and the partitioner hashes it (NewPublisher
// enforces both), so an aggregate's events of one topic land on one
// partition; the idempotent producer keeps a partition's order across its
// retries, and a batch's records are produced in the batch's order. Order
// holds per topic: events of one aggregate that Options.Topic sends to
// different topics are ordered within each topic only. Events without an
// aggregate ID have no key and no order.
//
// StoresPositions is set in transactional mode (Options.Transactional).
func (p *Publisher) Capabilities() core.PublisherCapabilities {
	return core.PublisherCapabilities{PreservesAggregateOrder: true, StoresPositions: p.opts.Transactional != nil}
}

// Close waits for the records in flight (the client's own timeouts bound
// that), then closes the client. An open transaction is aborted.
func (p *Publisher) Close() error {
	p.rw.Lock()
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.rw.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.abort(context.Background())
	p.drop()
	_ = p.cl.Flush(context.Background())
	p.cl.Close()
	return nil
}

// Marshal converts a Watermill message to a Kafka record in
// watermill-kafka's format: the UUID in the "_watermill_message_uuid"
// header, each metadata entry as a header, the payload as the value. The
// aggregate ID, when the metadata has one, is the key; a message without
// one gets no key and is spread over the partitions.
func Marshal(topic string, msg *message.Message) (*kgo.Record, error) {
	if msg.Metadata.Get(UUIDHeader) != "" {
		return nil, fmt.Errorf("metadata %s is reserved for the message UUID", UUIDHeader)
	}
	rec := &kgo.Record{Topic: topic, Value: msg.Payload, Headers: make([]kgo.RecordHeader, 0, len(msg.Metadata)+1)}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: UUIDHeader, Value: []byte(msg.UUID)})
	for k, v := range msg.Metadata {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	if key := msg.Metadata.Get(core.HeaderAggregateID); key != "" {
		rec.Key = []byte(key)
	}
	return rec, nil
}

// Unmarshal is Marshal's inverse: a Watermill message from a record.
func Unmarshal(rec *kgo.Record) *message.Message {
	var id string
	md := make(message.Metadata, len(rec.Headers))
	for _, h := range rec.Headers {
		if h.Key == UUIDHeader {
			id = string(h.Value)
			continue
		}
		md.Set(h.Key, string(h.Value))
	}
	msg := message.NewMessage(id, rec.Value)
	msg.Metadata = md
	return msg
}

// UUIDHeader is the record header that carries a message's UUID (the
// event ID), as watermill-kafka names it.
const UUIDHeader = "_watermill_message_uuid"
