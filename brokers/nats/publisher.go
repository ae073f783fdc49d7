package natsbroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/txoutbox/brokers/cloudevent"
	"github.com/txoutbox/txoutbox/core"
)

// maxInFlight bounds the unacknowledged messages of one Publish call, and
// sizes the connection's limit for all of them.
const maxInFlight = 1024

// Options configures a Publisher.
type Options struct {
	// URL is the NATS server: nats://host:4222, nats://user:pass@host:4222
	// or nats://token@host:4222; tls://host:4222 for TLS. Required unless
	// Conn is set.
	URL string
	// Conn is a connection of the caller's to use instead of dialling
	// URL; Close leaves it open.
	Conn *nats.Conn
	// Stream is the JetStream stream that must store every event.
	// Required.
	Stream string
	// StreamSubjects, when set, makes NewPublisher create the stream with
	// these subjects, file storage and DuplicateWindow, or update an
	// existing stream to them. When empty the stream must exist.
	StreamSubjects []string
	// DuplicateWindow is the duplicate window of a stream the publisher
	// creates or updates (StreamSubjects). Default two minutes,
	// JetStream's own default.
	DuplicateWindow time.Duration
	// Subject maps an event to its subject. Default core.TopicByEventType.
	Subject core.TopicFunc
	// NoMsgID leaves out the Nats-Msg-Id header, and with it JetStream's
	// dropping of a relay's republished copies. It exists to measure what
	// that header saves; leave it off.
	NoMsgID bool
	// Unordered sends every event of a batch at once, without waiting for
	// the acknowledgement of the previous event of its aggregate: faster
	// when a batch holds many events of one aggregate, but the publisher
	// then does not report aggregate order, and a relay with
	// core.OrderingAuto runs unordered.
	Unordered bool
	// AckTimeout bounds the wait for JetStream's acknowledgement of one
	// message. Default DefaultAckTimeout.
	AckTimeout time.Duration
	// CloudEvents, when set, sends events as CloudEvents 1.0 (NATS
	// binding: "ce-" headers in binary mode).
	CloudEvents *cloudevent.Options
	// Logger receives connection logs. Default slog.Default().
	Logger *slog.Logger
}

// Publisher is a core.Publisher to a JetStream stream.
type Publisher struct {
	nc      *nats.Conn
	ownConn bool
	js      jetstream.JetStream
	stream  string
	subject core.TopicFunc
	msgID   bool
	ordered bool
	ce      *cloudevent.Options
}

var _ core.Publisher = (*Publisher)(nil)

// NewPublisher connects to NATS (or uses Options.Conn), checks that the
// stream exists or creates it (Options.StreamSubjects), and returns a
// Publisher. Close it to close its connection.
func NewPublisher(ctx context.Context, opts Options) (*Publisher, error) {
	if opts.Stream == "" {
		return nil, fmt.Errorf("%w: natsbroker: Stream is empty", core.ErrInvalidOptions)
	}
	if opts.DuplicateWindow < 0 || opts.AckTimeout < 0 {
		return nil, fmt.Errorf("%w: natsbroker: negative DuplicateWindow or AckTimeout", core.ErrInvalidOptions)
	}
	for _, s := range opts.StreamSubjects {
		if err := checkSubject(s, true); err != nil {
			return nil, fmt.Errorf("%w: natsbroker: StreamSubjects: %w", core.ErrInvalidOptions, err)
		}
	}
	if opts.CloudEvents != nil {
		if err := opts.CloudEvents.Validate(); err != nil {
			return nil, err
		}
	}
	if opts.AckTimeout == 0 {
		opts.AckTimeout = DefaultAckTimeout
	}
	if opts.DuplicateWindow == 0 {
		opts.DuplicateWindow = 2 * time.Minute
	}
	if opts.Subject == nil {
		opts.Subject = core.TopicByEventType
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	p := &Publisher{nc: opts.Conn, stream: opts.Stream, subject: opts.Subject, msgID: !opts.NoMsgID, ordered: !opts.Unordered, ce: opts.CloudEvents}
	if p.nc == nil {
		nc, err := connect(opts.URL, "txoutbox publisher", opts.Logger)
		if err != nil {
			return nil, err
		}
		p.nc, p.ownConn = nc, true
	}
	js, err := jetstream.New(p.nc,
		jetstream.WithPublishAsyncMaxPending(4*maxInFlight),
		jetstream.WithPublishAsyncTimeout(opts.AckTimeout))
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("natsbroker: %w", err)
	}
	p.js = js
	if len(opts.StreamSubjects) > 0 {
		_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name:       opts.Stream,
			Subjects:   opts.StreamSubjects,
			Storage:    jetstream.FileStorage,
			Duplicates: opts.DuplicateWindow,
		})
	} else {
		_, err = js.Stream(ctx, opts.Stream)
	}
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("natsbroker: stream %q: %w", opts.Stream, err)
	}
	return p, nil
}

// Capabilities implements core.Publisher: one aggregate's events are
// stored in the order they were published (see the package doc), unless
// Options.Unordered.
func (p *Publisher) Capabilities() core.PublisherCapabilities {
	return core.PublisherCapabilities{PreservesAggregateOrder: p.ordered}
}

// sent is one message of a batch on its way.
type sent struct {
	paf  jetstream.PubAckFuture
	done bool
}

// Publish sends the events to JetStream and returns when it acknowledged
// each of them, with a *core.BatchError naming those it did not. Messages
// of different aggregates are all sent before the first acknowledgement is
// awaited; an event waits for the acknowledgement of the previous event of
// its aggregate (not with Options.Unordered), so that it cannot be stored
// when that one was not.
func (p *Publisher) Publish(ctx context.Context, events []core.Event) error {
	if len(events) == 0 {
		return nil
	}
	be := core.NewBatchError(len(events))
	for start := 0; start < len(events); start += maxInFlight {
		p.publishChunk(ctx, events[start:min(start+maxInFlight, len(events))], be.Errs[start:])
	}
	return be.ErrOrNil()
}

// publishChunk publishes events (at most maxInFlight) and fills errs.
func (p *Publisher) publishChunk(ctx context.Context, events []core.Event, errs []error) {
	inFlight := make([]sent, len(events))
	last := map[string]int{} // aggregate -> index of its latest event sent
	for i := range events {
		ev := &events[i]
		if ctx.Err() != nil {
			errs[i] = fmt.Errorf("%w: event %s: %w", ErrPublish, ev.ID, ctx.Err())
			continue
		}
		key := ev.AggregateType + "\x00" + ev.AggregateID
		if p.ordered && ev.AggregateID != "" {
			if j, ok := last[key]; ok {
				p.await(ctx, events, inFlight, errs, j)
				if errs[j] != nil {
					errs[i] = fmt.Errorf("%w: %s event %s of aggregate %s: %w", ErrPublish, ev.EventType, ev.ID, ev.AggregateID, ErrEarlierFailed)
					continue
				}
			}
			last[key] = i
		}
		msg, err := p.message(ev)
		if err != nil {
			errs[i] = core.Permanent(fmt.Errorf("%w: %w: %s event %s: %w", ErrPublish, core.ErrInvalidEvent, ev.EventType, ev.ID, err))
			continue
		}
		popts := []jetstream.PublishOpt{jetstream.WithExpectStream(p.stream)}
		if p.msgID {
			popts = append(popts, jetstream.WithMsgID(ev.ID))
		}
		paf, err := p.js.PublishMsgAsync(msg, popts...)
		if err != nil {
			errs[i] = p.failure(ev, msg.Subject, err)
			continue
		}
		inFlight[i].paf = paf
	}
	for i := range events {
		p.await(ctx, events, inFlight, errs, i)
	}
}

// await waits for the acknowledgement of events[i], once, and records its
// outcome in errs[i].
func (p *Publisher) await(ctx context.Context, events []core.Event, inFlight []sent, errs []error, i int) {
	s := &inFlight[i]
	if s.paf == nil || s.done {
		return
	}
	s.done = true
	select {
	case <-s.paf.Ok():
		// Stored, or dropped as a duplicate of a copy JetStream stored
		// earlier: published either way.
	case err := <-s.paf.Err():
		errs[i] = p.failure(&events[i], s.paf.Msg().Subject, err)
	case <-ctx.Done():
		errs[i] = fmt.Errorf("%w: event %s: waiting for JetStream's acknowledgement: %w", ErrPublish, events[i].ID, ctx.Err())
	}
}

// failure wraps err for ev, marking what can never succeed as permanent.
func (p *Publisher) failure(ev *core.Event, subject string, err error) error {
	err = fmt.Errorf("%w: %s event %s to subject %q: %w", ErrPublish, ev.EventType, ev.ID, subject, err)
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return core.Permanent(fmt.Errorf("%w: larger than the server's max_payload (%d bytes)", err, p.nc.MaxPayload()))
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return core.Permanent(fmt.Errorf("%w: larger than stream %q's max_msg_size", err, p.stream))
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse):
		return fmt.Errorf("%w: no stream captures the subject (stream %q expected; set Options.StreamSubjects, or add the subject to the stream)", err, p.stream)
	}
	return err
}

// message builds ev's NATS message, or says why NATS can never carry it.
func (p *Publisher) message(ev *core.Event) (*nats.Msg, error) {
	subject := p.subject(ev)
	if err := checkSubject(subject, false); err != nil {
		return nil, err
	}
	msg := nats.NewMsg(subject)
	msg.Data = ev.Payload
	headers := ev.MessageHeaders()
	if p.ce != nil {
		m, err := p.ce.Encode(ev, cloudevent.NATS)
		if err != nil {
			return nil, err
		}
		msg.Data, headers = m.Body, m.Headers
	}
	for k, v := range headers {
		if err := checkHeader(k, v); err != nil {
			return nil, err
		}
		msg.Header.Set(k, v)
	}
	return msg, nil
}

// checkSubject refuses what is not a NATS subject: empty, with white
// space or an empty token; and, unless wildcards are allowed, with one.
func checkSubject(s string, wildcards bool) error {
	if s == "" {
		return errors.New("empty subject")
	}
	if strings.ContainsAny(s, " \t\r\n") {
		return fmt.Errorf("subject %q contains white space", s)
	}
	for _, tok := range strings.Split(s, ".") {
		switch {
		case tok == "":
			return fmt.Errorf("subject %q has an empty token", s)
		case !wildcards && (tok == "*" || tok == ">"):
			return fmt.Errorf("subject %q has a wildcard; events need a literal subject", s)
		}
	}
	return nil
}

// checkHeader refuses a header NATS cannot carry as written: a name with a
// colon, white space or control characters, a value with a line break.
func checkHeader(k, v string) error {
	if k == "" {
		return errors.New("empty header name")
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c == ':' || c == 127 {
			return fmt.Errorf("header name %.32q has a character NATS headers cannot carry", k)
		}
	}
	if strings.ContainsAny(v, "\r\n") {
		return fmt.Errorf("header %.32q has a line break in its value", k)
	}
	return nil
}

// Close closes the publisher's connection, unless it was Options.Conn.
func (p *Publisher) Close() error {
	if p.ownConn {
		p.nc.Close()
	}
	return nil
}
