// Package tracing carries OpenTelemetry traces through the outbox, from the
// producer's transaction to the consumer's handler.
//
//	producer:  Enqueue runs EnqueueHook, which writes the current trace
//	           context into the event's Headers (W3C traceparent/tracestate
//	           by default). The headers are stored with the row.
//	relay:     Store and Publisher decorators make one trace per batch: a
//	           txoutbox.batch span with claim, publish and mark children.
//	           The publish span links to every event's producer span.
//	consumer:  StartConsumer (or Middleware, for a Watermill router) reads
//	           the trace context from the message metadata, which the relay
//	           copies from the event headers, and starts the consumer span as
//	           a child of the producer's span.
//
// Publish spans are per batch, not per event: core.Publisher receives a
// batch, so a per-event span could not time anything the batch span does not
// already time, and a relay moving thousands of events per second would
// emit thousands of spans that say nothing more. The link to each producer
// span keeps the way from any trace to the batch that published it; the
// consumer side remains one trace with the producer, because the header the
// consumer reads is the producer's, not the relay's.
//
// Nothing here touches the relay's code: the decorators wrap what it is
// given, as the metrics package does, and both may be stacked.
package tracing

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/txoutbox/txoutbox/core"
)

// ScopeName is the instrumentation scope of the spans this package makes.
const ScopeName = "github.com/txoutbox/txoutbox/tracing"

// Span names.
const (
	SpanBatch   = "txoutbox.batch"
	SpanClaim   = "txoutbox.claim"
	SpanPublish = "txoutbox.publish"
	SpanMark    = "txoutbox.mark"
	SpanRelease = "txoutbox.release"
	SpanConsume = "txoutbox.consume"
)

// Attribute keys. The messaging.* keys follow the OpenTelemetry messaging
// semantic conventions; the txoutbox.* keys are this project's.
const (
	AttrBatchCount    = attribute.Key("messaging.batch.message_count")
	AttrOperation     = attribute.Key("messaging.operation.type")
	AttrMessageID     = attribute.Key("messaging.message.id")
	AttrConsumerGroup = attribute.Key("messaging.consumer.group.name")
	AttrEventType     = attribute.Key("txoutbox.event_type")
	AttrAggregateType = attribute.Key("txoutbox.aggregate_type")
	AttrAggregateID   = attribute.Key("txoutbox.aggregate_id")
	AttrSeq           = attribute.Key("txoutbox.seq")
	AttrClaimLimit    = attribute.Key("txoutbox.claim.limit")
	AttrPublished     = attribute.Key("txoutbox.published")
	AttrFailed        = attribute.Key("txoutbox.failed")
	AttrDeadLettered  = attribute.Key("txoutbox.dead_lettered")
)

// MaxLinks bounds the links of one publish span; the SDK's default span limit
// is 128 links, and more would be dropped silently anyway.
const MaxLinks = 128

// Options configures a Tracing. Zero fields take their defaults.
type Options struct {
	// TracerProvider makes the tracer. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator writes and reads the trace context in event headers.
	// Default: W3C Trace Context and Baggage, explicitly rather than the
	// global propagator, because the global one is a no-op until an
	// application sets it, and a silent no-op here loses every trace.
	Propagator propagation.TextMapPropagator
}

// Tracing holds the tracer and the propagator shared by the hook, the
// decorators and the consumer helpers. It is safe for concurrent use.
type Tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	// batches maps the Seqs of each open claim to its batch span, so
	// that the publish span joins the batch's trace.
	batches sync.Map // int64 -> trace.SpanContext
}

// New returns a Tracing.
func New(opts Options) *Tracing {
	if opts.TracerProvider == nil {
		opts.TracerProvider = otel.GetTracerProvider()
	}
	if opts.Propagator == nil {
		opts.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return &Tracing{tracer: opts.TracerProvider.Tracer(ScopeName), prop: opts.Propagator}
}

// Propagator returns the propagator in use.
func (t *Tracing) Propagator() propagation.TextMapPropagator { return t.prop }

// EnqueueHook returns a core.EnqueueHook that writes the trace context of the
// producer's ctx into each event's Headers. With no active span in ctx it
// writes nothing (a header naming no trace would only cost bytes).
// Headers the producer set itself are kept, except the propagator's own
// keys, which the current context overwrites.
func (t *Tracing) EnqueueHook() core.EnqueueHook {
	return func(ctx context.Context, ev *core.Event) error {
		if !trace.SpanContextFromContext(ctx).IsValid() {
			return nil
		}
		if ev.Headers == nil {
			ev.Headers = make(map[string]string, 2)
		}
		t.prop.Inject(ctx, propagation.MapCarrier(ev.Headers))
		return nil
	}
}

// ContextFromHeaders returns ctx with the remote span context (and baggage)
// stored in headers: an event's Headers or a message's metadata. It is the
// building block of StartConsumer, for consumers that make their own spans.
func (t *Tracing) ContextFromHeaders(ctx context.Context, headers map[string]string) context.Context {
	return t.prop.Extract(ctx, propagation.MapCarrier(headers))
}

// StartConsumer continues the producer's trace in a consumer: it extracts the
// trace context from the message metadata and starts a consumer span, named
// SpanConsume, as its child. consumer names the consuming service (the inbox
// consumer name). The caller ends the span and should record the handler's
// error on it (EndConsumer does both).
//
// The inbox middleware calls it before opening its transaction, so that the
// deduplication and the handler are both inside the span.
func (t *Tracing) StartConsumer(ctx context.Context, consumer string, metadata map[string]string) (context.Context, trace.Span) {
	ctx = t.ContextFromHeaders(ctx, metadata)
	attrs := []attribute.KeyValue{AttrOperation.String("process")}
	if consumer != "" {
		attrs = append(attrs, AttrConsumerGroup.String(consumer))
	}
	for key, attr := range map[string]attribute.Key{
		core.HeaderEventID:       AttrMessageID,
		core.HeaderEventType:     AttrEventType,
		core.HeaderAggregateType: AttrAggregateType,
		core.HeaderAggregateID:   AttrAggregateID,
	} {
		if v := metadata[key]; v != "" {
			attrs = append(attrs, attr.String(v))
		}
	}
	return t.tracer.Start(ctx, SpanConsume, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

// EndConsumer records err (if any) on a span from StartConsumer and ends it.
func EndConsumer(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Middleware returns a Watermill handler middleware that runs each handler
// inside a consumer span continuing the producer's trace. Put it before the
// inbox middleware so that the inbox transaction is traced too.
func (t *Tracing) Middleware(consumer string) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx, span := t.StartConsumer(msg.Context(), consumer, msg.Metadata)
			msg.SetContext(ctx)
			out, err := h(msg)
			EndConsumer(span, err)
			return out, err
		}
	}
}

func fail(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}

// Publisher returns p decorated with a producer span per batch, linked to the
// producer span of each event (up to MaxLinks), and a child of the batch span
// when the Store is decorated by the same Tracing. The span is the parent of
// whatever the broker client traces, through the ctx given to p; the events'
// own headers are passed on unchanged, so consumers continue the producer's
// trace. Events that failed are recorded as span events with their error.
func (t *Tracing) Publisher(p core.Publisher) core.Publisher { return &publisher{inner: p, t: t} }

type publisher struct {
	inner core.Publisher
	t     *Tracing
}

// Unwrap implements core.PublisherWrapper.
func (p *publisher) Unwrap() core.Publisher { return p.inner }

// Capabilities forwards the decorated publisher's: tracing changes none.
func (p *publisher) Capabilities() core.PublisherCapabilities { return p.inner.Capabilities() }

func (p *publisher) Publish(ctx context.Context, events []core.Event) error {
	t := p.t
	{
		links := make([]trace.Link, 0, min(len(events), MaxLinks))
		for i := range events {
			if len(links) == MaxLinks {
				break
			}
			sc := trace.SpanContextFromContext(t.ContextFromHeaders(context.Background(), events[i].Headers))
			if sc.IsValid() {
				links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
					AttrMessageID.String(events[i].ID), AttrEventType.String(events[i].EventType),
				}})
			}
		}
		if len(events) > 0 {
			if sc, ok := t.batches.Load(events[0].Seq); ok {
				ctx = trace.ContextWithSpanContext(ctx, sc.(trace.SpanContext))
			}
		}
		ctx, span := t.tracer.Start(ctx, SpanPublish,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithLinks(links...),
			trace.WithAttributes(AttrOperation.String("send"), AttrBatchCount.Int(len(events))))
		defer span.End()
		err := p.inner.Publish(ctx, events)
		if err != nil {
			errs := core.EventErrors(err, len(events))
			failed := 0
			for i, e := range errs {
				if e == nil {
					continue
				}
				failed++
				span.AddEvent("publish failed", trace.WithAttributes(
					AttrMessageID.String(events[i].ID), AttrEventType.String(events[i].EventType),
					AttrSeq.Int64(events[i].Seq), attribute.String("error", e.Error())))
			}
			span.SetAttributes(AttrFailed.Int(failed))
			span.SetStatus(codes.Error, strconv.Itoa(failed)+" of "+strconv.Itoa(len(events))+" events failed: "+err.Error())
		}
		return err
	}
}

// Store returns s decorated with spans: each claim that returns events gets
// a SpanBatch span, from the start of the claim to its commit or release,
// with the SpanClaim and SpanMark (or SpanRelease) spans as its children, and
// the SpanPublish span too when the publisher is decorated by the same
// Tracing. An empty claim makes no span, so that an idle relay polling every
// second does not flood the tracing backend; a failed claim makes a SpanClaim
// span with the error. Capabilities pass through, and the decorated store
// unwraps to s (core.StoreWrapper), so that a relay on it finds all that s
// can do; read Stats from s and clean up with s.
func (t *Tracing) Store(s core.Store) core.Store { return &store{inner: s, t: t} }

type store struct {
	inner core.Store
	t     *Tracing
}

func (s *store) Capabilities() core.StoreCapabilities { return s.inner.Capabilities() }

// Unwrap implements core.StoreWrapper: the relay finds the wrapped store's
// optional interfaces (its wake-up signal, its leaser) there.
func (s *store) Unwrap() core.Store { return s.inner }

func (s *store) Claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	start := time.Now()
	c, err := s.inner.Claim(ctx, req)
	if err != nil {
		_, span := s.t.tracer.Start(ctx, SpanClaim, trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(start),
			trace.WithAttributes(AttrClaimLimit.Int(req.Limit)))
		fail(span, err)
		span.End()
		return nil, err
	}
	events := c.Events()
	if len(events) == 0 {
		return c, nil
	}
	// The spans start when the claim started, now that we know it was worth
	// a trace.
	bctx, batch := s.t.tracer.Start(ctx, SpanBatch, trace.WithTimestamp(start),
		trace.WithAttributes(AttrBatchCount.Int(len(events))))
	_, span := s.t.tracer.Start(bctx, SpanClaim, trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(start),
		trace.WithAttributes(AttrClaimLimit.Int(req.Limit), AttrBatchCount.Int(len(events))))
	span.End()
	// An open claim holds its events exclusively, so each Seq names the
	// batch until the claim ends. Every Seq, not just the first: in ordered
	// mode the relay publishes a claim in several rounds.
	seqs := make([]int64, len(events))
	for i := range events {
		seqs[i] = events[i].Seq
		s.t.batches.Store(seqs[i], batch.SpanContext())
	}
	return &claim{Claim: c, t: s.t, batch: batch, seqs: seqs}, nil
}

type claim struct {
	core.Claim
	t     *Tracing
	batch trace.Span
	seqs  []int64
	once  sync.Once
}

func (c *claim) end() {
	c.once.Do(func() {
		for _, seq := range c.seqs {
			c.t.batches.Delete(seq)
		}
		c.batch.End()
	})
}

func (c *claim) Commit(ctx context.Context, out core.Outcome) error {
	dead := 0
	for _, f := range out.Failed {
		if f.Dead {
			dead++
		}
	}
	ctx, span := c.t.tracer.Start(trace.ContextWithSpan(ctx, c.batch), SpanMark, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(AttrBatchCount.Int(len(c.Events())), AttrPublished.Int(len(out.Published)),
			AttrFailed.Int(len(out.Failed)), AttrDeadLettered.Int(dead)))
	err := c.Claim.Commit(ctx, out)
	fail(span, err)
	span.End()
	fail(c.batch, err)
	c.end()
	return err
}

func (c *claim) Release(ctx context.Context) error {
	ctx, span := c.t.tracer.Start(trace.ContextWithSpan(ctx, c.batch), SpanRelease, trace.WithSpanKind(trace.SpanKindClient))
	err := c.Claim.Release(ctx)
	if !errors.Is(err, core.ErrClaimDone) {
		fail(span, err)
	}
	span.End()
	c.end()
	return err
}
