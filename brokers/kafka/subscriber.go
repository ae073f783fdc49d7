package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/txoutbox/core"
)

// SubscriberOptions configures NewSubscriber.
type SubscriberOptions struct {
	// Brokers are the bootstrap addresses. Required.
	Brokers []string
	// ConsumerGroup is the Kafka consumer group: instances with the same
	// group share the partitions, and the group's committed offsets say
	// where a restarted consumer resumes. A new group starts at the oldest
	// offset, so that nothing published before its first subscription is
	// missed. Required.
	ConsumerGroup string
	// Client are further franz-go options: TLS, SASL, kgo.SessionTimeout,
	// kgo.RebalanceTimeout, kgo.FetchIsolationLevel... The subscriber
	// applies its group, topic and offset-commit settings after them.
	Client []kgo.Opt
	// NackResendSleep is the pause before a nacked message is delivered
	// again. Default 100ms.
	NackResendSleep time.Duration
	// Logger receives the subscriber's logs. Default slog.Default().
	Logger *slog.Logger
}

// Subscriber is a Watermill message.Subscriber that consumes topics as one
// Kafka consumer group (franz-go). Each partition's messages come one at a
// time, in order: the next after the previous one was acked. An acked
// message's offset is committed (every few seconds, and when the partition
// is given to another member or the subscriber closes); a nacked one is
// delivered again. Messages are read with isolation.level=read_committed
// unless Client says otherwise, so records of aborted transactions never
// arrive. A message's UUID is the event ID and its metadata the record's
// headers (see Unmarshal).
type Subscriber struct {
	opts SubscriberOptions

	mu     sync.Mutex
	closed bool
	cancel []context.CancelFunc
	wg     sync.WaitGroup
}

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber checks opts and returns a Subscriber; it connects on
// Subscribe.
func NewSubscriber(opts SubscriberOptions) (*Subscriber, error) {
	if len(opts.Brokers) == 0 {
		return nil, fmt.Errorf("%w: no Brokers", core.ErrInvalidOptions)
	}
	if opts.ConsumerGroup == "" {
		return nil, fmt.Errorf("%w: ConsumerGroup is empty", core.ErrInvalidOptions)
	}
	if opts.NackResendSleep < 0 {
		return nil, fmt.Errorf("%w: kafkabroker: negative NackResendSleep", core.ErrInvalidOptions)
	}
	if opts.NackResendSleep == 0 {
		opts.NackResendSleep = 100 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Subscriber{opts: opts}, nil
}

// Subscribe joins the consumer group for topic and returns its messages.
// The channel closes when ctx ends or the subscriber closes.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := validTopic(topic); err != nil {
		return nil, fmt.Errorf("%w: kafkabroker: subscribe: %w", core.ErrInvalidOptions, err)
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(s.opts.Brokers...),
		kgo.ClientID("txoutbox"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.AllowAutoTopicCreation(),
	}
	opts = append(opts, s.opts.Client...)
	opts = append(opts,
		kgo.ConsumerGroup(s.opts.ConsumerGroup),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Only what was acked is committed; the rebalance waits until the
		// messages of a poll are handled, so that no partition is handled
		// by two members at once.
		kgo.AutoCommitMarks(),
		kgo.BlockRebalanceOnPoll(),
	)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("%w: kafkabroker: subscriber closed", core.ErrClosed)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafkabroker: subscriber: %w", core.ErrInvalidOptions, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	s.cancel = append(s.cancel, cancel)
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer cl.Close() // leaves the group, committing what was marked
		s.consume(ctx, cl, out)
	}()
	return out, nil
}

// consume polls until ctx ends and hands each partition's records to out,
// one partition per goroutine.
func (s *Subscriber) consume(ctx context.Context, cl *kgo.Client, out chan<- *message.Message) {
	log := s.opts.Logger
	// A poll, even one cut short by ctx, holds rebalances (and so the
	// leave on Close) until AllowRebalance.
	defer cl.AllowRebalance()
	for ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			return
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				log.Warn("kafkabroker: fetch failed; the client retries", "topic", topic, "partition", p, "error", err)
			}
		})
		var wg sync.WaitGroup
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, r := range p.Records {
					if !s.deliver(ctx, r, out) {
						return
					}
					cl.MarkCommitRecords(r)
				}
			}()
		})
		wg.Wait()
		cl.AllowRebalance()
	}
}

// deliver sends r's message until it is acked (true) or ctx ends (false).
func (s *Subscriber) deliver(ctx context.Context, r *kgo.Record, out chan<- *message.Message) bool {
	for {
		msg := Unmarshal(r)
		mctx, cancel := context.WithCancel(ctx)
		msg.SetContext(mctx)
		select {
		case out <- msg:
		case <-ctx.Done():
			cancel()
			return false
		}
		select {
		case <-msg.Acked():
			cancel()
			return true
		case <-msg.Nacked():
			cancel()
		case <-ctx.Done():
			cancel()
			return false
		}
		select {
		case <-time.After(s.opts.NackResendSleep):
		case <-ctx.Done():
			return false
		}
	}
}

// Close ends every subscription, waits for their channels to close, and
// leaves the group, committing the acked offsets.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.closed = true
	for _, c := range s.cancel {
		c()
	}
	s.cancel = nil
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}
