package snsbroker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/smithy-go"

	"github.com/txoutbox/txoutbox/brokers/cloudevent"
	"github.com/txoutbox/txoutbox/core"
)

// Errors the publisher wraps, so that callers can tell them apart with
// errors.Is.
var (
	// ErrUnknownTopic means no topic ARN could be resolved for a topic
	// name: it is not in Options.TopicARNs, and neither CreateTopics nor
	// TopicARNPrefix is set.
	ErrUnknownTopic = errors.New("snsbroker: unknown topic")
	// ErrMessageTooLarge means an event's body and attributes exceed
	// MaxMessageBytes; SNS would refuse it, so it is not sent.
	ErrMessageTooLarge = errors.New("snsbroker: message too large")
	// ErrInvalidHeader means a header cannot be sent at all (not UTF-8), or
	// a received overflow attribute cannot be decoded.
	ErrInvalidHeader = errors.New("snsbroker: invalid header")
	// ErrNotConfirmed means SNS answered a PublishBatch without listing an
	// entry as successful or failed; the event counts as not published.
	ErrNotConfirmed = errors.New("snsbroker: entry not confirmed by PublishBatch")
	// ErrEarlierFailed is the error of an event on a FIFO topic that was
	// not sent because an earlier event of its message group failed in the
	// same call: sending it would overtake the failed one.
	ErrEarlierFailed = errors.New("snsbroker: earlier event of the message group failed")
	// ErrNotFIFO is the error of an event whose topic is not a FIFO topic
	// on a publisher with Options.FIFOOnly; it is not sent.
	ErrNotFIFO = errors.New("snsbroker: topic is not a FIFO topic")
	// ErrEntryFailed is matched by every *EntryError.
	ErrEntryFailed = errors.New("snsbroker: PublishBatch entry failed")
	// ErrNotNotification means a body is not an SNS notification envelope.
	ErrNotNotification = errors.New("snsbroker: not an SNS notification")
)

// EntryError is SNS's refusal of one entry of a PublishBatch call.
type EntryError struct {
	// Code is SNS's error code, e.g. "InvalidParameter".
	Code string
	// Message is SNS's explanation.
	Message string
	// SenderFault is true when the entry itself is wrong (retrying the same
	// entry will fail again) and false when SNS failed.
	SenderFault bool
}

// Error tells SNS's code and message.
func (e *EntryError) Error() string {
	return fmt.Sprintf("snsbroker: PublishBatch entry failed: %s: %s (sender fault: %t)", e.Code, e.Message, e.SenderFault)
}

// Is makes errors.Is(err, ErrEntryFailed) true.
func (e *EntryError) Is(target error) bool { return target == ErrEntryFailed }

// API is the part of *sns.Client the publisher uses; *sns.Client satisfies
// it, and so does any wrapper a user puts around one.
type API interface {
	Publish(ctx context.Context, in *sns.PublishInput, optFns ...func(*sns.Options)) (*sns.PublishOutput, error)
	PublishBatch(ctx context.Context, in *sns.PublishBatchInput, optFns ...func(*sns.Options)) (*sns.PublishBatchOutput, error)
	CreateTopic(ctx context.Context, in *sns.CreateTopicInput, optFns ...func(*sns.Options)) (*sns.CreateTopicOutput, error)
}

// Options configures a Publisher. The zero value publishes every event to
// the topic named TopicName(event type) and needs CreateTopics,
// TopicARNPrefix or TopicARNs to find its ARN.
type Options struct {
	// Topic chooses the topic of an event: a topic name, or a full ARN.
	// Default: TopicName(ev.EventType).
	Topic core.TopicFunc
	// TopicARNs maps topic names to ARNs; it is consulted first.
	TopicARNs map[string]string
	// CreateTopics creates a topic that is not in TopicARNs with
	// CreateTopic (which SNS makes idempotent) the first time it is used,
	// and caches its ARN. Names ending in ".fifo" are created as FIFO
	// topics.
	CreateTopics bool
	// TopicAttributes are passed to CreateTopic, e.g.
	// {"ContentBasedDeduplication": "false"}.
	TopicAttributes map[string]string
	// TopicARNPrefix, when CreateTopics is false, resolves a name that is
	// not in TopicARNs to TopicARNPrefix+name, e.g.
	// "arn:aws:sns:eu-west-1:123456789012:".
	TopicARNPrefix string
	// MaxBatchSize is the most events per PublishBatch call, 1 to 10.
	// Default 10. 1 sends every event with Publish, for endpoints that lack
	// PublishBatch (the goaws emulator).
	MaxBatchSize int
	// MaxAttributes is the most message attributes per message, 5 to 10.
	// Default MaxAttributes (10). The package documentation tells what
	// happens to headers beyond it.
	MaxAttributes int
	// OverflowAttribute names the attribute that carries the headers that
	// do not fit. Default DefaultOverflowAttribute.
	OverflowAttribute string
	// Concurrency is the most calls to SNS one Publish keeps in flight for
	// a standard topic. Default 1: calls go one after the other, so events
	// also leave in order. Calls to a FIFO topic are always sequential.
	Concurrency int
	// FIFOOnly declares that every event goes to a FIFO topic, so that the
	// publisher keeps each aggregate's events in order (the aggregate ID is
	// the message group) and reports so to the relay
	// (Capabilities), which then runs in ordered mode under
	// core.OrderingAuto. The publisher holds to it: an event whose topic
	// ARN does not name a FIFO topic is not sent and fails with ErrNotFIFO.
	// Default false: the topics come from Topic, TopicARNs, CreateTopics
	// and TopicARNPrefix, from which the publisher cannot know that they
	// are all FIFO.
	FIFOOnly bool
	// Logger receives the publisher's logs. Default slog.Default().
	Logger *slog.Logger
	// CloudEvents, when set, sends events as CloudEvents 1.0: in binary
	// mode the attributes as "ce-" message attributes (SNS has no
	// CloudEvents binding; this follows the HTTP binding's names), in
	// structured mode the JSON event as the message.
	CloudEvents *cloudevent.Options
}

func (o Options) withDefaults() (Options, error) {
	if o.CloudEvents != nil {
		if err := o.CloudEvents.Validate(); err != nil {
			return o, err
		}
	}
	if o.Topic == nil {
		o.Topic = func(ev *core.Event) string { return TopicName(ev.EventType) }
	}
	if o.MaxBatchSize == 0 {
		o.MaxBatchSize = MaxBatchEntries
	}
	if o.MaxBatchSize < 1 || o.MaxBatchSize > MaxBatchEntries {
		return o, fmt.Errorf("%w: snsbroker: MaxBatchSize %d not in [1, %d]", core.ErrInvalidOptions, o.MaxBatchSize, MaxBatchEntries)
	}
	if o.MaxAttributes == 0 {
		o.MaxAttributes = MaxAttributes
	}
	// Four identity headers and the overflow attribute must always fit.
	if o.MaxAttributes < len(identityHeaders)+1 || o.MaxAttributes > MaxAttributes {
		return o, fmt.Errorf("%w: snsbroker: MaxAttributes %d not in [%d, %d]", core.ErrInvalidOptions, o.MaxAttributes, len(identityHeaders)+1, MaxAttributes)
	}
	if o.OverflowAttribute == "" {
		o.OverflowAttribute = DefaultOverflowAttribute
	}
	if !validAttributeName(o.OverflowAttribute) {
		return o, fmt.Errorf("%w: snsbroker: OverflowAttribute %q is not a valid attribute name", core.ErrInvalidOptions, o.OverflowAttribute)
	}
	if o.Concurrency == 0 {
		o.Concurrency = 1
	}
	if o.Concurrency < 0 {
		return o, fmt.Errorf("%w: snsbroker: negative Concurrency %d", core.ErrInvalidOptions, o.Concurrency)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// TopicName turns an event type into a valid SNS topic name: every
// character other than ASCII letters, digits, '-' and '_' becomes '_'
// ("order.created" -> "order_created"), except a ".fifo" suffix, which is
// kept so that the topic is a FIFO topic.
func TopicName(eventType string) string {
	base, suffix := eventType, ""
	if strings.HasSuffix(base, ".fifo") {
		base, suffix = strings.TrimSuffix(base, ".fifo"), ".fifo"
	}
	b := []byte(base)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b) + suffix
}

// IsFIFO reports whether a topic name or ARN names a FIFO topic.
func IsFIFO(topic string) bool { return strings.HasSuffix(topic, ".fifo") }

// Publisher publishes outbox events to SNS topics. It implements
// core.Publisher; MessagePublisher gives the same publisher as a Watermill
// message.Publisher. It is safe for concurrent use.
type Publisher struct {
	api  API
	opts Options
	log  *slog.Logger

	mu   sync.Mutex
	arns map[string]string // topic name -> ARN, resolved or created

	closed atomic.Bool
}

var _ core.Publisher = (*Publisher)(nil)

// Capabilities implements core.Publisher. PreservesAggregateOrder is
// Options.FIFOOnly: only FIFO topics keep order (per message group, which
// is the aggregate ID); without FIFOOnly the publisher cannot tell that
// every topic it will be handed is one, and reports false.
func (p *Publisher) Capabilities() core.PublisherCapabilities {
	return core.PublisherCapabilities{PreservesAggregateOrder: p.opts.FIFOOnly}
}

// NewPublisher returns a Publisher sending through api, usually an
// *sns.Client (see NewClient).
func NewPublisher(api API, opts Options) (*Publisher, error) {
	if api == nil {
		return nil, fmt.Errorf("%w: snsbroker.NewPublisher needs an SNS client", core.ErrInvalidOptions)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Publisher{api: api, opts: opts, log: opts.Logger, arns: map[string]string{}}, nil
}

// entry is one message to send, from an event or a Watermill message.
type entry struct {
	idx     int // position in the caller's batch
	id      string
	topic   string // name or ARN
	body    string
	headers map[string]string
	group   string // FIFO message group
}

// Publish sends events, in PublishBatch calls of up to MaxBatchSize events
// per topic, and reports per event which ones SNS refused, in a
// *core.BatchError. Events SNS confirmed are never reported as failed, so the
// relay retries only the failed ones. On FIFO topics the message group is the
// aggregate ID (the event type when it is empty) and the deduplication ID is
// the event ID; once an event of a group failed, the group's later events in
// the same call are not sent (ErrEarlierFailed), so that retries keep order.
func (p *Publisher) Publish(ctx context.Context, events []core.Event) error {
	if len(events) == 0 {
		return nil
	}
	if p.closed.Load() {
		return fmt.Errorf("%w: snsbroker: publisher closed", core.ErrClosed)
	}
	errs := make([]error, len(events))
	entries := make([]entry, 0, len(events))
	for i := range events {
		ev := &events[i]
		topic := p.opts.Topic(ev)
		if topic == "" {
			errs[i] = core.Permanent(fmt.Errorf("%w: no topic for %s event %s", core.ErrInvalidEvent, ev.EventType, ev.ID))
			continue
		}
		group := ev.AggregateID
		if group == "" {
			group = ev.EventType
		}
		body, headers := ev.Payload, ev.MessageHeaders()
		if p.opts.CloudEvents != nil {
			m, err := p.opts.CloudEvents.Encode(ev, cloudevent.SNS)
			if err != nil {
				errs[i] = core.Permanent(err)
				continue
			}
			body, headers = m.Body, m.Headers
		}
		entries = append(entries, entry{idx: i, id: ev.ID, topic: topic, body: string(body), headers: headers, group: group})
	}
	p.send(ctx, entries, errs)
	return (&core.BatchError{Errs: errs}).ErrOrNil()
}

// Close makes later Publish calls fail with core.ErrClosed. Calls in flight
// finish. The SNS client needs no closing.
func (p *Publisher) Close() error {
	p.closed.Store(true)
	return nil
}

// send publishes entries topic by topic and fills errs at each entry's idx.
func (p *Publisher) send(ctx context.Context, entries []entry, errs []error) {
	var order []string
	byTopic := map[string][]entry{}
	for _, e := range entries {
		if _, ok := byTopic[e.topic]; !ok {
			order = append(order, e.topic)
		}
		byTopic[e.topic] = append(byTopic[e.topic], e)
	}
	for _, topic := range order {
		p.sendTopic(ctx, topic, byTopic[topic], errs)
	}
}

// prepared is an entry ready for SNS.
type prepared struct {
	entry
	attrs map[string]types.MessageAttributeValue
	size  int
	bad   error // why it cannot be sent at all
}

func (p *Publisher) sendTopic(ctx context.Context, topic string, entries []entry, errs []error) {
	arn, err := p.topicARN(ctx, topic)
	if err != nil {
		for _, e := range entries {
			errs[e.idx] = err
		}
		return
	}
	fifo := IsFIFO(arn)
	if p.opts.FIFOOnly && !fifo {
		for _, e := range entries {
			errs[e.idx] = core.Permanent(fmt.Errorf("%w: event %s to %s (Options.FIFOOnly)", ErrNotFIFO, e.id, arn))
		}
		return
	}
	ready := make([]prepared, 0, len(entries))
	for _, e := range entries {
		attrs, asize, err := encodeAttributes(e.headers, p.opts.MaxAttributes, p.opts.OverflowAttribute)
		size := len(e.body) + asize
		switch {
		case err != nil:
			err = fmt.Errorf("event %s: %w", e.id, err)
		case size > MaxMessageBytes:
			err = fmt.Errorf("%w: event %s is %d bytes, SNS takes %d", ErrMessageTooLarge, e.id, size, MaxMessageBytes)
		}
		// A bad event stays in line, so that on a FIFO topic it holds back
		// its group's later events like a refused one. It can never be
		// sent: the relay dead-letters it at once.
		ready = append(ready, prepared{entry: e, attrs: attrs, size: size, bad: core.Permanent(err)})
	}
	call := func(chunk []prepared) {
		if p.opts.MaxBatchSize == 1 {
			p.publishOne(ctx, arn, fifo, chunk[0], errs)
		} else {
			p.publishBatch(ctx, arn, fifo, chunk, errs)
		}
	}
	// Calls in flight write only their own entries' errs.
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, p.opts.Concurrency)
	failedGroups := map[string]bool{}
	for len(ready) > 0 {
		// Build the next chunk, skipping FIFO groups that failed earlier:
		// their events must wait for the failed one's retry.
		var chunk []prepared
		size := 0
		n := 0
		for n < len(ready) && len(chunk) < p.opts.MaxBatchSize {
			e := ready[n]
			if e.bad != nil {
				errs[e.idx] = e.bad
				if fifo {
					failedGroups[e.group] = true
				}
				n++
				continue
			}
			if fifo && failedGroups[e.group] {
				errs[e.idx] = fmt.Errorf("%w: event %s, group %q", ErrEarlierFailed, e.id, e.group)
				n++
				continue
			}
			if len(chunk) > 0 && size+e.size > MaxMessageBytes {
				break
			}
			chunk = append(chunk, e)
			size += e.size
			n++
		}
		ready = ready[n:]
		if len(chunk) == 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			for _, e := range chunk {
				errs[e.idx] = err
			}
			for _, e := range ready {
				errs[e.idx] = cmp.Or(e.bad, err)
			}
			return
		}
		if fifo || p.opts.Concurrency == 1 {
			// A FIFO topic's next call depends on this one's outcome.
			call(chunk)
			for _, e := range chunk {
				if errs[e.idx] != nil && fifo {
					failedGroups[e.group] = true
				}
			}
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			for _, e := range append(chunk, ready...) {
				errs[e.idx] = cmp.Or(e.bad, ctx.Err())
			}
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			call(chunk)
		}()
	}
}

func (p *Publisher) publishOne(ctx context.Context, arn string, fifo bool, e prepared, errs []error) {
	in := &sns.PublishInput{TopicArn: aws.String(arn), Message: aws.String(e.body), MessageAttributes: e.attrs}
	if fifo {
		in.MessageGroupId = aws.String(e.group)
		in.MessageDeduplicationId = aws.String(e.id)
	}
	if _, err := p.api.Publish(ctx, in); err != nil {
		errs[e.idx] = permanentIfRefused(fmt.Errorf("snsbroker: publish event %s to %s: %w", e.id, arn, err))
	}
}

func (p *Publisher) publishBatch(ctx context.Context, arn string, fifo bool, chunk []prepared, errs []error) {
	in := &sns.PublishBatchInput{TopicArn: aws.String(arn), PublishBatchRequestEntries: make([]types.PublishBatchRequestEntry, len(chunk))}
	for k, e := range chunk {
		// Entry IDs only need to be unique within the call; the position is.
		re := types.PublishBatchRequestEntry{Id: aws.String(strconv.Itoa(k)), Message: aws.String(e.body), MessageAttributes: e.attrs}
		if fifo {
			re.MessageGroupId = aws.String(e.group)
			re.MessageDeduplicationId = aws.String(e.id)
		}
		in.PublishBatchRequestEntries[k] = re
	}
	out, err := p.api.PublishBatch(ctx, in)
	if err != nil {
		for _, e := range chunk {
			errs[e.idx] = permanentIfRefused(fmt.Errorf("snsbroker: publish batch of %d to %s (event %s): %w", len(chunk), arn, e.id, err))
		}
		return
	}
	// Until SNS says otherwise an entry is unconfirmed, never published.
	res := make([]error, len(chunk))
	for k, e := range chunk {
		res[k] = fmt.Errorf("%w: event %s on %s", ErrNotConfirmed, e.id, arn)
	}
	pos := func(id *string) (int, bool) {
		k, err := strconv.Atoi(aws.ToString(id))
		return k, err == nil && k >= 0 && k < len(chunk)
	}
	for _, s := range out.Successful {
		if k, ok := pos(s.Id); ok {
			res[k] = nil
		}
	}
	failed := 0
	for _, f := range out.Failed {
		if k, ok := pos(f.Id); ok {
			failed++
			ee := &EntryError{Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
			res[k] = fmt.Errorf("snsbroker: publish event %s to %s: %w", chunk[k].id, arn, ee)
			if refusedForGood(ee.Code) {
				res[k] = core.Permanent(res[k])
			}
		}
	}
	if failed > 0 {
		p.log.WarnContext(ctx, "snsbroker: PublishBatch refused entries", "topic", arn, "entries", len(chunk), "failed", failed)
	}
	for k, e := range chunk {
		errs[e.idx] = res[k]
	}
}

// topicARN resolves a topic name to its ARN: an ARN as is, then
// Options.TopicARNs, the cache, CreateTopic, TopicARNPrefix.
func (p *Publisher) topicARN(ctx context.Context, topic string) (string, error) {
	if topic == "" {
		return "", core.Permanent(fmt.Errorf("%w: empty topic name", ErrUnknownTopic))
	}
	if strings.HasPrefix(topic, "arn:") {
		return topic, nil
	}
	if arn, ok := p.opts.TopicARNs[topic]; ok {
		return arn, nil
	}
	p.mu.Lock()
	arn, ok := p.arns[topic]
	p.mu.Unlock()
	if ok {
		return arn, nil
	}
	switch {
	case p.opts.CreateTopics:
		// Not under the lock: a slow CreateTopic must not hold up other
		// topics. Two concurrent creations of one topic are harmless,
		// CreateTopic is idempotent.
		attrs := map[string]string{}
		for k, v := range p.opts.TopicAttributes {
			attrs[k] = v
		}
		if IsFIFO(topic) {
			attrs["FifoTopic"] = "true"
		}
		out, err := p.api.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(topic), Attributes: attrs})
		if err != nil {
			return "", permanentIfRefused(fmt.Errorf("snsbroker: create topic %q: %w", topic, err))
		}
		arn = aws.ToString(out.TopicArn)
		if arn == "" {
			return "", fmt.Errorf("snsbroker: create topic %q: no ARN in the answer", topic)
		}
		p.log.InfoContext(ctx, "snsbroker: topic ready", "topic", topic, "arn", arn)
	case p.opts.TopicARNPrefix != "":
		arn = p.opts.TopicARNPrefix + topic
	default:
		return "", core.Permanent(fmt.Errorf("%w: %q (set TopicARNs, TopicARNPrefix or CreateTopics)", ErrUnknownTopic, topic))
	}
	p.mu.Lock()
	p.arns[topic] = arn
	p.mu.Unlock()
	return arn, nil
}

// permanentIfRefused marks err permanent when SNS refused the request for
// good: a topic that does not exist (NotFound), a parameter it will never
// accept (an invalid topic name, a non-FIFO topic for a group ID), or a
// request it denies. Create the topic or fix the configuration, then
// re-queue the dead events (txoutbox dead retry).
func permanentIfRefused(err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) && refusedForGood(ae.ErrorCode()) {
		return core.Permanent(err)
	}
	return err
}

// refusedForGood reports whether an SNS error code means the request will
// never succeed as it is.
func refusedForGood(code string) bool {
	switch code {
	case "NotFound", "NotFoundException", "InvalidParameter", "InvalidParameterException", "InvalidParameterValue", "AuthorizationError":
		return true
	}
	return false
}

// MessagePublisher returns p as a Watermill message.Publisher, sharing its
// topic cache and its closed state.
func (p *Publisher) MessagePublisher() *MessagePublisher { return &MessagePublisher{p: p} }

// MessagePublisher is a Publisher seen as a Watermill message.Publisher, so
// that it swaps in for the other brokers' Watermill publishers. (One type
// cannot be both: core.Publisher and message.Publisher each have a Publish
// method, with different parameters.)
type MessagePublisher struct{ p *Publisher }

var _ message.Publisher = (*MessagePublisher)(nil)

// Publish sends msgs to topic (a name, resolved like an event's topic, or an
// ARN), batched like Publisher.Publish. The payload is the SNS message, the
// metadata are its attributes, and the message UUID travels as the event_id
// header when the metadata has none, as watermillbroker.NewMessage sets it. On FIFO
// topics the group is the aggregate_id metadata (else the topic) and the
// deduplication ID the event_id. It uses the context of the first message.
// When some messages fail it returns a *core.BatchError with one entry per
// message.
func (m *MessagePublisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if m.p.closed.Load() {
		return fmt.Errorf("%w: snsbroker: publisher closed", core.ErrClosed)
	}
	ctx := msgs[0].Context()
	entries := make([]entry, len(msgs))
	for i, msg := range msgs {
		h := make(map[string]string, len(msg.Metadata)+1)
		for k, v := range msg.Metadata {
			h[k] = v
		}
		if h[core.HeaderEventID] == "" {
			h[core.HeaderEventID] = msg.UUID
		}
		group := h[core.HeaderAggregateID]
		if group == "" {
			group = topic
		}
		entries[i] = entry{idx: i, id: h[core.HeaderEventID], topic: topic, body: string(msg.Payload), headers: h, group: group}
	}
	errs := make([]error, len(msgs))
	m.p.send(ctx, entries, errs)
	return (&core.BatchError{Errs: errs}).ErrOrNil()
}

// Close closes the underlying Publisher.
func (m *MessagePublisher) Close() error { return m.p.Close() }
