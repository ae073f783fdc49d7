package amqpbroker

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/txoutbox/txoutbox/core"
)

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
	// queue's messages. Required.
	Consumer string
	// Prefetch is how many unacknowledged messages RabbitMQ sends ahead to
	// one subscription. Default 16.
	Prefetch int
	// TLSConfig and Reconnect are as in Options.
	TLSConfig *tls.Config
	Reconnect Reconnect
	// Logger receives connection logs. Default slog.Default().
	Logger *slog.Logger
}

// Subscriber is a Watermill message.Subscriber on RabbitMQ queues.
type Subscriber struct {
	conn     *conn
	topology Topology
	consumer string
	prefetch int
	recon    Reconnect
	log      *slog.Logger
	marshal  wamqp.DefaultMarshaler

	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

// NewSubscriber connects to RabbitMQ and returns a subscriber that consumes
// what a Publisher with the same Topology sent.
func NewSubscriber(opts SubscriberOptions) (*Subscriber, error) {
	if opts.URL == "" {
		return nil, fmt.Errorf("%w: URL is empty", core.ErrInvalidOptions)
	}
	if opts.Consumer == "" {
		return nil, fmt.Errorf("%w: Consumer is empty", core.ErrInvalidOptions)
	}
	if err := opts.Topology.validate(); err != nil {
		return nil, err
	}
	if opts.Prefetch < 0 {
		return nil, fmt.Errorf("%w: negative Prefetch", core.ErrInvalidOptions)
	}
	if opts.Prefetch == 0 {
		opts.Prefetch = 16
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	c, err := newConn(dialer(opts.URL, opts.TLSConfig, "txoutbox subscriber "+opts.Consumer), opts.Reconnect, opts.Logger)
	if err != nil {
		return nil, fmt.Errorf("amqpbroker: connect subscriber: %w", err)
	}
	return &Subscriber{
		conn: c, topology: opts.Topology, consumer: opts.Consumer, prefetch: opts.Prefetch,
		recon: opts.Reconnect.withDefaults(), log: opts.Logger, closing: make(chan struct{}),
	}, nil
}

// Subscribe declares the consumer's durable queue of topic (and its exchange
// and binding), then delivers its messages one at a time until ctx ends or
// the subscriber is closed: the next message comes after the previous one
// was acked (basic.ack) or nacked (requeued). After a connection loss it
// re-dials and resumes; unacked messages are redelivered by RabbitMQ.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	select {
	case <-s.closing:
		return nil, fmt.Errorf("amqpbroker: subscriber closed")
	default:
	}
	// Declare now, so that what is published after Subscribe returns
	// reaches the queue.
	if err := s.withChannel(func(ch *amqp.Channel) error {
		_, err := s.topology.declareQueue(ch, s.consumer, topic)
		return err
	}); err != nil {
		return nil, fmt.Errorf("amqpbroker: subscribe %q: %w", topic, err)
	}
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		wait := s.recon.Min
		for {
			err := s.consume(ctx, topic, out)
			if ctx.Err() != nil || s.isClosing() {
				return
			}
			// One warning per interruption: the loop first waits for the
			// connection to be back.
			s.log.Warn("amqpbroker: consuming stopped; resuming", "topic", topic, "error", err, "retry_in", wait)
			select {
			case <-ctx.Done():
				return
			case <-s.closing:
				return
			case <-s.conn.ready():
			}
			select {
			case <-ctx.Done():
				return
			case <-s.closing:
				return
			case <-time.After(wait):
			}
			if err == nil {
				wait = s.recon.Min
			} else {
				wait = min(2*wait, s.recon.Max)
			}
		}
	}()
	return out, nil
}

func (s *Subscriber) isClosing() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

func (s *Subscriber) withChannel(fn func(*amqp.Channel) error) error {
	c, _, err := s.conn.get()
	if err != nil {
		return err
	}
	ch, err := c.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return fn(ch)
}

// consume runs one channel's consumer until it or ctx ends.
func (s *Subscriber) consume(ctx context.Context, topic string, out chan<- *message.Message) error {
	c, _, err := s.conn.get()
	if err != nil {
		return err
	}
	ch, err := c.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	queue, err := s.topology.declareQueue(ch, s.consumer, topic)
	if err != nil {
		return err
	}
	if err := ch.Qos(s.prefetch, 0, false); err != nil {
		return err
	}
	// Not ConsumeWithContext: its cancel racing our Close leaves Close
	// waiting for a close-ok forever (seen with amqp091-go v1.16.0).
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	for {
		var d amqp.Delivery
		var ok bool
		select {
		case d, ok = <-deliveries:
			if !ok {
				return fmt.Errorf("%w: channel closed", ErrNotConnected)
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closing:
			return nil
		}
		msg, err := s.marshal.Unmarshal(d)
		if err != nil {
			// Not a message we can hand over; requeueing would loop forever.
			s.log.Error("amqpbroker: dropping a message that does not decode", "queue", queue, "error", err)
			_ = d.Nack(false, false)
			continue
		}
		mctx, cancel := context.WithCancel(ctx)
		msg.SetContext(mctx)
		select {
		case out <- msg:
		case <-ctx.Done():
			cancel()
			return ctx.Err()
		case <-s.closing:
			cancel()
			return nil
		}
		select {
		case <-msg.Acked():
			err = d.Ack(false)
		case <-msg.Nacked():
			err = d.Nack(false, true)
		case <-ctx.Done():
			err = ctx.Err()
		case <-s.closing:
		}
		cancel()
		if err != nil {
			return err
		}
		if s.isClosing() {
			return nil
		}
	}
}

// Close stops every subscription, waits for them, and closes the
// connection. A message handed out but not acked is redelivered.
func (s *Subscriber) Close() error {
	s.once.Do(func() { close(s.closing) })
	s.wg.Wait()
	return s.conn.close()
}
