package natsbroker

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/txoutbox/core"
)

// SubscriberOptions configures NewSubscriber.
type SubscriberOptions struct {
	// URL and Conn are as in Options.
	URL  string
	Conn *nats.Conn
	// Stream is the stream to consume from. Required.
	Stream string
	// Consumer names the consumer group: Subscribe(ctx, subject) consumes
	// through the durable JetStream consumer DurableName(Consumer,
	// subject), filtered on the subject (which may hold wildcards).
	// Instances with the same Consumer share its messages. Required.
	Consumer string
	// AckWait is how long JetStream waits for a message's acknowledgement
	// before it delivers the message again. Default 30s.
	AckWait time.Duration
	// MaxAckPending is how many messages JetStream delivers to the
	// consumer ahead of their acknowledgements. Default 1: the next
	// message waits for the previous one's ack, so that a message
	// redelivered (after a nack, or after AckWait when a consumer died
	// holding it) is never overtaken by a later one, which keeps one
	// aggregate's events in order. A larger value pulls ahead for
	// throughput and gives up that order on redelivery.
	MaxAckPending int
	// Logger receives consumer logs. Default slog.Default().
	Logger *slog.Logger
}

// Subscriber is a Watermill message.Subscriber on durable JetStream
// consumers. A message's UUID is its event ID and its metadata holds the
// event's headers. One subscription hands out one message at a time, and
// by default JetStream delivers the next only once the previous one was
// acked (SubscriberOptions.MaxAckPending), so a handler sees one
// aggregate's events in stream order, redeliveries included. A nacked
// message is delivered again at once.
type Subscriber struct {
	nc       *nats.Conn
	ownConn  bool
	js       jetstream.JetStream
	stream   string
	consumer string
	ackWait  time.Duration
	// maxAckPending is SubscriberOptions.MaxAckPending.
	maxAckPending int
	log           *slog.Logger

	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber connects to NATS (or uses SubscriberOptions.Conn) and
// returns a Subscriber. Close it to end its subscriptions and close its
// connection.
func NewSubscriber(opts SubscriberOptions) (*Subscriber, error) {
	if opts.Stream == "" || opts.Consumer == "" {
		return nil, fmt.Errorf("%w: natsbroker: Stream and Consumer are required", core.ErrInvalidOptions)
	}
	if opts.AckWait < 0 || opts.MaxAckPending < 0 {
		return nil, fmt.Errorf("%w: natsbroker: negative AckWait or MaxAckPending", core.ErrInvalidOptions)
	}
	if opts.MaxAckPending == 0 {
		opts.MaxAckPending = 1
	}
	if opts.AckWait == 0 {
		opts.AckWait = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Subscriber{nc: opts.Conn, stream: opts.Stream, consumer: opts.Consumer, ackWait: opts.AckWait, maxAckPending: opts.MaxAckPending,
		log: opts.Logger, closing: make(chan struct{})}
	if s.nc == nil {
		nc, err := connect(opts.URL, "txoutbox subscriber "+opts.Consumer, opts.Logger)
		if err != nil {
			return nil, err
		}
		s.nc, s.ownConn = nc, true
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("natsbroker: %w", err)
	}
	s.js = js
	return s, nil
}

// DurableName is the name of the durable consumer that Subscribe uses for
// consumer and subject: the two joined, with what a consumer name cannot
// hold replaced, and a hash of the subject so that "a.b" and "a_b" differ.
func DurableName(consumer, subject string) string {
	clean := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r <= ' ' || strings.ContainsRune(".*>/\\", r) {
				return '_'
			}
			return r
		}, s)
	}
	h := fnv.New32a()
	h.Write([]byte(subject))
	return fmt.Sprintf("%s_%s_%08x", clean(consumer), clean(subject), h.Sum32())
}

// Subscribe creates or updates the durable consumer of topic (a subject,
// wildcards allowed) and streams its messages until ctx ends or the
// subscriber closes.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := checkSubject(topic, true); err != nil {
		return nil, fmt.Errorf("natsbroker: subscribe: %w", err)
	}
	cons, err := s.js.CreateOrUpdateConsumer(ctx, s.stream, jetstream.ConsumerConfig{
		Durable:       DurableName(s.consumer, topic),
		FilterSubject: topic,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.ackWait,
		MaxAckPending: s.maxAckPending,
	})
	if err != nil {
		return nil, fmt.Errorf("natsbroker: consumer %s on stream %q: %w", DurableName(s.consumer, topic), s.stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("natsbroker: consume %q: %w", topic, err)
	}
	out := make(chan *message.Message)
	ctx, cancel := context.WithCancel(ctx)
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		select {
		case <-ctx.Done():
		case <-s.closing:
		}
		cancel()
		it.Stop()
	}()
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer cancel()
		s.consume(ctx, it, out, topic)
	}()
	return out, nil
}

// consume hands the iterator's messages out one at a time and acks or
// naks each as its handler did.
func (s *Subscriber) consume(ctx context.Context, it jetstream.MessagesContext, out chan<- *message.Message, topic string) {
	failing := false
	for {
		m, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
			return
		}
		if err != nil {
			// Missed heartbeats while the server is away: the iterator
			// pulls again once the connection is back.
			if !failing {
				s.log.Warn("natsbroker: consuming; retrying", "subject", topic, "err", err)
				failing = true
			}
			continue
		}
		failing = false
		wm := toMessage(m)
		wm.SetContext(ctx)
		select {
		case out <- wm:
		case <-ctx.Done():
			return // not acked: JetStream delivers it again after AckWait
		}
		select {
		case <-wm.Acked():
			if err := m.Ack(); err != nil {
				s.log.Warn("natsbroker: ack failed; JetStream will deliver the message again", "subject", m.Subject(), "err", err)
			}
		case <-wm.Nacked():
			if err := m.Nak(); err != nil {
				s.log.Warn("natsbroker: nak failed", "subject", m.Subject(), "err", err)
			}
		case <-ctx.Done():
			return
		}
	}
}

// toMessage converts a JetStream message to a Watermill message: its UUID
// is the event ID (the event_id header, else Nats-Msg-Id), its metadata
// the headers other than JetStream's own (Nats-*).
func toMessage(m jetstream.Msg) *message.Message {
	h := m.Headers()
	id := h.Get(core.HeaderEventID)
	if id == "" {
		id = h.Get(jetstream.MsgIDHeader)
	}
	wm := message.NewMessage(id, m.Data())
	for k, v := range h {
		if len(v) > 0 && !strings.HasPrefix(k, "Nats-") {
			wm.Metadata.Set(k, v[0])
		}
	}
	return wm
}

// Close ends every subscription, waits for them, and closes the
// subscriber's connection unless it was SubscriberOptions.Conn.
func (s *Subscriber) Close() error {
	s.once.Do(func() { close(s.closing) })
	s.wg.Wait()
	if s.ownConn {
		s.nc.Close()
	}
	return nil
}
