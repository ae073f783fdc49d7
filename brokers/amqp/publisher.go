package amqpbroker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/txoutbox/brokers/cloudevent"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
)

// DefaultChannels is the default Options.Channels.
const DefaultChannels = 4

// maxInFlight bounds the messages one channel has unconfirmed; it is also
// the buffer of the channel's returns, so that RabbitMQ's reader goroutine
// never blocks on a return while we wait for confirms.
const maxInFlight = 1024

// AMQP limits the publisher checks before it sends anything, so that one
// event the broker would refuse fails alone instead of closing the channel
// under the rest of its batch.
const (
	// MaxShortString is the longest AMQP short string: exchange names,
	// routing keys, header names.
	MaxShortString = 255
	// DefaultMaxMessageBytes is RabbitMQ's default max_message_size
	// (128 MiB), the default of Options.MaxMessageBytes.
	DefaultMaxMessageBytes = 128 << 20
)

// errNotSent marks the events of a batch that a failed channel kept from
// being written at all: they are sent again on a fresh channel.
var errNotSent = errors.New("amqpbroker: not sent")

// Options configures a Publisher.
type Options struct {
	// URL is the AMQP URL with credentials and vhost:
	// amqp://user:pass@host:5672/vhost, or amqps://...:5671/... for TLS.
	// Required.
	URL string
	// Topology must match the subscribers'.
	Topology
	// Topic maps an event to its topic. Default core.TopicByEventType.
	Topic core.TopicFunc
	// Consumers names consumers whose durable queues the publisher declares
	// and binds before its first publish to a topic, so that their events
	// wait in the queue even before the consumer first subscribed.
	Consumers []string
	// AllowUnroutable accepts RabbitMQ's confirm of a message that no queue
	// is bound to (RabbitMQ drops it). By default messages are mandatory and
	// such an event fails with ErrUnroutable and stays in the outbox.
	AllowUnroutable bool
	// Channels is how many AMQP channels (each in confirm mode) the
	// publisher keeps; concurrent Publish calls (relay workers) use one
	// each. Default DefaultChannels.
	Channels int
	// MaxMessageBytes is the largest message body the broker takes (its
	// max_message_size); a larger event fails permanently before it is
	// sent. Default DefaultMaxMessageBytes.
	MaxMessageBytes int
	// TLSConfig replaces the TLS configuration of an amqps:// URL (private
	// CA, client certificate). Optional.
	TLSConfig *tls.Config
	// Reconnect tunes re-dialling after the connection dropped.
	Reconnect Reconnect
	// CloudEvents, when set, sends events as CloudEvents 1.0 (AMQP
	// binding: "cloudEvents:" application properties in binary mode).
	CloudEvents *cloudevent.Options
	// Logger receives connection logs. Default slog.Default().
	Logger *slog.Logger
}

// Publisher is a core.Publisher to RabbitMQ with publisher confirms.
//
// Messages are encoded by watermill-amqp's DefaultMarshaler, so Watermill
// subscribers (this package's or watermill-amqp's own) read them as
// Watermill messages whose UUID is the event ID.
type Publisher struct {
	conn      *conn
	topology  Topology
	topic     core.TopicFunc
	consumers []string
	mandatory bool
	maxBytes  int
	marshal   wamqp.DefaultMarshaler
	ce        *cloudevent.Options
	pool      chan *confirmChannel

	mu       sync.Mutex
	declared map[string]uint64 // topic -> connection generation it was declared on
}

// confirmChannel is a channel in confirm mode with its returns.
type confirmChannel struct {
	ch      *amqp.Channel
	gen     uint64
	returns chan amqp.Return
}

// NewPublisher connects to RabbitMQ and returns a Publisher. Close it to
// close the connection.
func NewPublisher(opts Options) (*Publisher, error) {
	if opts.URL == "" {
		return nil, fmt.Errorf("%w: URL is empty", core.ErrInvalidOptions)
	}
	if err := opts.Topology.validate(); err != nil {
		return nil, err
	}
	if opts.Channels < 0 {
		return nil, fmt.Errorf("%w: negative Channels", core.ErrInvalidOptions)
	}
	if opts.Channels == 0 {
		opts.Channels = DefaultChannels
	}
	if opts.MaxMessageBytes < 0 {
		return nil, fmt.Errorf("%w: amqpbroker: negative MaxMessageBytes", core.ErrInvalidOptions)
	}
	if opts.MaxMessageBytes == 0 {
		opts.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if opts.Topic == nil {
		opts.Topic = core.TopicByEventType
	}
	if opts.CloudEvents != nil {
		if err := opts.CloudEvents.Validate(); err != nil {
			return nil, err
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	c, err := newConn(dialer(opts.URL, opts.TLSConfig, "txoutbox publisher"), opts.Reconnect, opts.Logger)
	if err != nil {
		return nil, fmt.Errorf("amqpbroker: connect publisher: %w", err)
	}
	p := &Publisher{
		conn:      c,
		topology:  opts.Topology,
		topic:     opts.Topic,
		consumers: opts.Consumers,
		mandatory: !opts.AllowUnroutable,
		maxBytes:  opts.MaxMessageBytes,
		ce:        opts.CloudEvents,
		pool:      make(chan *confirmChannel, opts.Channels),
		declared:  map[string]uint64{},
	}
	for range opts.Channels {
		p.pool <- nil // opened on first use
	}
	return p, nil
}

// Capabilities implements core.Publisher. RabbitMQ keeps the order of one
// channel's messages in a queue, but a relay's concurrent Publish calls
// use several channels, and a consumer's prefetch and redeliveries reorder
// them, so the publisher does not promise aggregate order.
func (p *Publisher) Capabilities() core.PublisherCapabilities { return core.PublisherCapabilities{} }

// Publish sends the events on one channel, in order, and returns when
// RabbitMQ confirmed each of them, with a *core.BatchError naming the ones
// it nacked, returned as unroutable, or did not confirm before the channel
// or connection closed. All messages are published before the first confirm
// is awaited, so a batch costs about one round trip and one disk sync.
//
// An event RabbitMQ can never take (a routing key, exchange or header name
// over 255 bytes, a header value AMQP cannot encode, a body over
// MaxMessageBytes) fails alone, permanently (core.Permanent), before
// anything is sent. When the channel fails anyway (a declaration refused,
// the broker closing it), the events it kept from being written, and those
// it left unconfirmed, are sent again once on a fresh channel within the
// same call, so that they do not pay for another event's fault; a
// duplicate that this may make is absorbed by the consumers' inbox.
//
// RabbitMQ keeps the order of one channel's messages in a queue, so one
// aggregate's events arrive in the order of the batch.
func (p *Publisher) Publish(ctx context.Context, events []core.Event) error {
	if len(events) == 0 {
		return nil
	}
	be := core.NewBatchError(len(events))
	var cc *confirmChannel
	select {
	case cc = <-p.pool:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { p.pool <- cc }()

	for start := 0; start < len(events); start += maxInFlight {
		idx := make([]int, 0, maxInFlight)
		for i := start; i < min(start+maxInFlight, len(events)); i++ {
			idx = append(idx, i)
		}
		for try := 0; len(idx) > 0; try++ {
			cc = p.publishOnce(ctx, cc, events, idx, be.Errs)
			// Send again what a failed channel kept back, once.
			var again []int
			for _, i := range idx {
				if errors.Is(be.Errs[i], errNotSent) {
					again = append(again, i)
				}
			}
			if try > 0 || ctx.Err() != nil {
				break
			}
			for _, i := range again {
				be.Errs[i] = nil
			}
			idx = again
		}
	}
	return be.ErrOrNil()
}

// publishOnce publishes events[i] for i in idx on cc (or a fresh channel)
// and fills errs; it returns the channel to keep, nil when it broke.
func (p *Publisher) publishOnce(ctx context.Context, cc *confirmChannel, events []core.Event, idx []int, errs []error) *confirmChannel {
	var err error
	if err = ctx.Err(); err == nil {
		cc, err = p.channel(ctx, cc)
	}
	if err != nil {
		for _, i := range idx {
			errs[i] = fmt.Errorf("event %s: %w", events[i].ID, err)
		}
		return cc
	}
	if !p.publishChunk(ctx, cc, events, idx, errs) {
		return cc
	}
	// Broken: the next call opens a fresh channel.
	if ctx.Err() != nil {
		// RabbitMQ did not confirm in time. If it stopped reading this
		// connection (a memory or disk alarm blocks publishers without a
		// word), closing the channel would wait for an answer that never
		// comes; dropping the connection frees every call on it, and the
		// publisher re-dials.
		p.conn.drop(cc.gen, ctx.Err())
	} else {
		cc.ch.Close()
	}
	return nil
}

// channel returns cc if it is still open on the current connection, or a
// fresh confirm-mode channel. Opening one is a round trip that amqp091
// cannot bound: if RabbitMQ stops answering (a network that holds every
// byte), it would wait until the heartbeat gives the connection up, some
// 30 s, whatever the publish's deadline. At ctx's end the connection is
// dropped instead, which frees the open, and the publish fails in time.
func (p *Publisher) channel(ctx context.Context, cc *confirmChannel) (*confirmChannel, error) {
	c, gen, err := p.conn.get()
	if err != nil {
		return nil, err
	}
	if cc != nil && cc.gen == gen && !cc.ch.IsClosed() {
		return cc, nil
	}
	var fresh *confirmChannel
	err = p.bounded(ctx, gen, "open channel", func() error {
		ch, err := c.Channel()
		if err != nil {
			return fmt.Errorf("%w: open channel: %w", ErrNotConnected, err)
		}
		if err := ch.Confirm(false); err != nil {
			ch.Close()
			return fmt.Errorf("%w: confirm mode: %w", ErrNotConnected, err)
		}
		fresh = &confirmChannel{ch: ch, gen: gen, returns: ch.NotifyReturn(make(chan amqp.Return, maxInFlight))}
		return nil
	}, func() { fresh.ch.Close() })
	if err != nil {
		return nil, err
	}
	return fresh, nil
}

// bounded runs op, a round trip on connection gen that amqp091 cannot
// bound, and gives it up at ctx's end: it drops the connection, which
// makes op return soon (and the publisher re-dial), and returns at once an
// error that wraps ErrNotConnected and ctx's, naming what. If op succeeds
// after all, undo (when not nil) releases what it made.
func (p *Publisher) bounded(ctx context.Context, gen uint64, what string, op func() error, undo func()) error {
	done := make(chan error, 1)
	go func() { done <- op() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		p.conn.drop(gen, ctx.Err())
		go func() {
			if err := <-done; err == nil && undo != nil {
				undo()
			}
		}()
		return fmt.Errorf("%w: %s: RabbitMQ did not answer: %w", ErrNotConnected, what, ctx.Err())
	}
}

// check returns why RabbitMQ can never take msg for topic on exchange, or
// nil.
func (p *Publisher) check(topic, exchange string, msg *amqp.Publishing) error {
	switch {
	case len(topic) > MaxShortString:
		return fmt.Errorf("routing key (topic) is %d bytes, AMQP takes %d", len(topic), MaxShortString)
	case len(exchange) > MaxShortString:
		return fmt.Errorf("exchange name is %d bytes, AMQP takes %d", len(exchange), MaxShortString)
	case len(msg.Body) > p.maxBytes:
		return fmt.Errorf("body is %d bytes, above MaxMessageBytes %d", len(msg.Body), p.maxBytes)
	}
	for k := range msg.Headers {
		if len(k) > MaxShortString {
			return fmt.Errorf("header name %.32q… is %d bytes, AMQP takes %d", k, len(k), MaxShortString)
		}
	}
	if err := msg.Headers.Validate(); err != nil {
		return fmt.Errorf("headers: %w", err)
	}
	return nil
}

// publishChunk publishes events[i] for i in idx (at most maxInFlight) and
// waits for their confirms, filling errs. It reports whether the channel is
// broken.
func (p *Publisher) publishChunk(ctx context.Context, cc *confirmChannel, events []core.Event, idx []int, errs []error) (broken bool) {
	confirms := make(map[int]*amqp.DeferredConfirmation, len(idx))
	exchanges := make(map[int]string, len(idx))
	for n, i := range idx {
		ev := &events[i]
		topic := p.topic(ev)
		if topic == "" {
			errs[i] = core.Permanent(fmt.Errorf("%w: no topic for %s event %s", core.ErrInvalidEvent, ev.EventType, ev.ID))
			continue
		}
		msg, err := p.encode(ctx, ev)
		if err != nil {
			errs[i] = core.Permanent(fmt.Errorf("%w: marshal event %s: %w", ErrPublish, ev.ID, err))
			continue
		}
		exchange := p.topology.ExchangeName(topic)
		if err := p.check(topic, exchange, &msg); err != nil {
			errs[i] = core.Permanent(fmt.Errorf("%w: %w: %s event %s: %w", ErrPublish, core.ErrInvalidEvent, ev.EventType, ev.ID, err))
			continue
		}
		if _, err := p.declare(ctx, cc, topic); err != nil {
			errs[i] = fmt.Errorf("%w: event %s: %w", ErrPublish, ev.ID, err)
			markNotSent(events, idx[n+1:], errs)
			broken = true
			break // a failed declaration closes the channel
		}
		exchanges[i] = exchange
		// MessageId matches a basic.return to its event.
		msg.MessageId = ev.ID
		dc, err := cc.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, topic, p.mandatory, false, msg)
		if err != nil {
			errs[i] = fmt.Errorf("%w: %s event %s to exchange %q: %w", ErrPublish, ev.EventType, ev.ID, exchange, err)
			markNotSent(events, idx[n+1:], errs)
			broken = true
			break
		}
		confirms[i] = dc
	}
	for _, i := range idx {
		dc := confirms[i]
		if dc == nil {
			continue
		}
		ack, err := dc.WaitContext(ctx)
		switch {
		case err != nil:
			// The broker may still take it; the relay retries and the
			// consumer's inbox absorbs a duplicate.
			errs[i] = fmt.Errorf("%w: event %s: waiting for confirm: %w", ErrPublish, events[i].ID, err)
			broken = true
		case !ack && cc.ch.IsClosed():
			// amqp091 nacks what was unconfirmed when the channel closed,
			// for another event's fault as often as not: send it again.
			errs[i] = fmt.Errorf("%w: %s event %s: the channel closed before its confirm: %w", ErrPublish, events[i].EventType, events[i].ID, errNotSent)
			broken = true
		case !ack:
			errs[i] = fmt.Errorf("%w: %s event %s to exchange %q: %w", ErrPublish, events[i].EventType, events[i].ID, exchanges[i], ErrNacked)
		}
	}
	// RabbitMQ sends basic.return before the ack of the same message, and
	// amqp091 hands both over in that order, so every return of this chunk
	// is in the buffer now.
	for {
		select {
		case r, ok := <-cc.returns:
			if !ok {
				return true
			}
			for _, i := range idx {
				if events[i].ID == r.MessageId && errs[i] == nil {
					errs[i] = fmt.Errorf("%w: %s event %s: exchange %q routed it to no queue (%d %s); declare the consumers' queues with Options.Consumers (relay --broker 'amqp://...?consumers=billing'), bind one, or set AllowUnroutable",
						ErrUnroutable, events[i].EventType, events[i].ID, r.Exchange, r.ReplyCode, r.ReplyText)
				}
			}
		default:
			return broken
		}
	}
}

// encode is ev as an AMQP message: watermill-amqp's encoding of the
// event, or of its CloudEvent.
func (p *Publisher) encode(ctx context.Context, ev *core.Event) (amqp.Publishing, error) {
	if p.ce == nil {
		msg, err := p.marshal.Marshal(watermillbroker.NewMessage(ctx, ev))
		msg.ContentType = "application/json"
		return msg, err
	}
	wm, contentType, err := p.ce.NewMessage(ctx, ev, cloudevent.AMQP)
	if err != nil {
		return amqp.Publishing{}, err
	}
	msg, err := p.marshal.Marshal(wm)
	msg.ContentType = contentType
	return msg, err
}

// markNotSent fails the events at idx that no error marks yet as kept back
// by a failed channel (errNotSent), so that Publish sends them again.
func markNotSent(events []core.Event, idx []int, errs []error) {
	for _, i := range idx {
		if errs[i] == nil {
			errs[i] = fmt.Errorf("%w: event %s: the channel failed before it: %w", ErrPublish, events[i].ID, errNotSent)
		}
	}
}

// declare declares topic's exchange, and the Consumers' queues, once per
// connection (durable ones survive a restart, but a new broker node has
// none). Its round trips are bounded by ctx like a channel's open, and run
// outside p.mu so that a declaration given up holds no other publish back
// (declaring twice is harmless).
func (p *Publisher) declare(ctx context.Context, cc *confirmChannel, topic string) (string, error) {
	p.mu.Lock()
	done := p.declared[topic] == cc.gen
	p.mu.Unlock()
	if done {
		return p.topology.ExchangeName(topic), nil
	}
	var exchange string
	err := p.bounded(ctx, cc.gen, "declare "+topic, func() error {
		var err error
		if exchange, err = p.topology.declare(cc.ch, topic); err != nil {
			return err
		}
		for _, c := range p.consumers {
			if _, err := p.topology.declareQueue(cc.ch, c, topic); err != nil {
				return err
			}
		}
		return nil
	}, nil)
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	p.declared[topic] = cc.gen
	p.mu.Unlock()
	return exchange, nil
}

// Close closes the publisher's channels and connection. Publish calls in
// flight fail.
func (p *Publisher) Close() error { return p.conn.close() }
