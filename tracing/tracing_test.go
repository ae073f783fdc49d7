package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	memoutbox "github.com/txoutbox/txoutbox/adapters/memory"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
	outboxtest "github.com/txoutbox/txoutbox/testing"
	"github.com/txoutbox/txoutbox/tracing"
)

// memStore is the reference in-memory store holding events, committed.
func memStore(t *testing.T, evs ...core.Event) *memoutbox.Store {
	t.Helper()
	s := memoutbox.New(memoutbox.Options{})
	tx := s.Begin()
	if err := s.Enqueue(context.Background(), tx, evs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return s
}

// downStore is a store whose every claim fails with err.
type downStore struct {
	*memoutbox.Store
	err error
}

func (s downStore) Claim(context.Context, core.ClaimRequest) (core.Claim, error) { return nil, s.err }

func setup(t *testing.T) (*tracing.Tracing, *tracetest.SpanRecorder, trace.Tracer) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tracing.New(tracing.Options{TracerProvider: tp}), rec, tp.Tracer("app")
}

// produce enqueues n events as a producer would: inside its own span, with
// the hook run by core.PrepareEvents. It returns the events (Seq from
// firstSeq) and the producer span's context.
func produce(t *testing.T, tr *tracing.Tracing, app trace.Tracer, firstSeq int64, n int) ([]core.Event, trace.SpanContext) {
	t.Helper()
	ctx, span := app.Start(context.Background(), "POST /orders")
	defer span.End()
	evs := make([]core.Event, n)
	for i := range evs {
		evs[i] = core.Event{Seq: firstSeq + int64(i), EventType: "order.created", AggregateID: fmt.Sprint(i),
			Headers: map[string]string{"tenant": "acme"}}
	}
	if err := core.PrepareEvents(ctx, evs, core.Limits{}, []core.EnqueueHook{tr.EnqueueHook()}); err != nil {
		t.Fatal(err)
	}
	return evs, span.SpanContext()
}

func TestEnqueueHookWritesTraceparent(t *testing.T) {
	tr, _, app := setup(t)
	evs, sc := produce(t, tr, app, 1, 1)
	h := evs[0].Headers
	want := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())
	if h["traceparent"] != want {
		t.Fatalf("traceparent = %q, want %q", h["traceparent"], want)
	}
	if h["tenant"] != "acme" {
		t.Fatalf("the producer's own header was lost: %v", h)
	}
	// Headers travel: the message the relay builds carries it.
	if got := watermillbroker.NewMessage(context.Background(), &evs[0]).Metadata.Get("traceparent"); got != want {
		t.Fatalf("message metadata traceparent = %q", got)
	}

	// No span, no header.
	plain := []core.Event{{EventType: "x"}}
	if err := core.PrepareEvents(context.Background(), plain, core.Limits{}, []core.EnqueueHook{tr.EnqueueHook()}); err != nil {
		t.Fatal(err)
	}
	if plain[0].Headers != nil {
		t.Fatalf("headers written without a trace: %v", plain[0].Headers)
	}
}

var errBroker = errors.New("broker refused")

func TestRelaySpansOneTracePerBatch(t *testing.T) {
	tr, rec, app := setup(t)
	evsA, scA := produce(t, tr, app, 1, 2)
	evsB, scB := produce(t, tr, app, 3, 1)
	st := memStore(t, append(evsA, evsB...)...)
	pub := core.PublisherFunc(func(ctx context.Context, events []core.Event) error {
		if !trace.SpanContextFromContext(ctx).IsValid() {
			return errors.New("the broker client got no span in its context")
		}
		be := core.NewBatchError(len(events))
		be.Errs[len(events)-1] = errBroker // the last one fails
		return be.ErrOrNil()
	})
	relay, err := core.NewRelay(tr.Store(st), tr.Publisher(pub), core.RelayOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := relay.Drain(context.Background())
	if err != nil || res.Published != 2 || res.Failed != 1 {
		t.Fatalf("Drain: %+v, %v", res, err)
	}

	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	// One batch; the empty claim that ended Drain made no span.
	for _, name := range []string{tracing.SpanBatch, tracing.SpanClaim, tracing.SpanPublish, tracing.SpanMark} {
		if len(byName[name]) != 1 {
			t.Fatalf("%d %s spans, want 1 (all: %v)", len(byName[name]), name, byName)
		}
	}
	if n := len(byName[tracing.SpanRelease]); n != 0 {
		t.Fatalf("%d release spans for empty claims", n)
	}
	batch := byName[tracing.SpanBatch][0]
	for _, name := range []string{tracing.SpanClaim, tracing.SpanPublish, tracing.SpanMark} {
		s := byName[name][0]
		if s.Parent().SpanID() != batch.SpanContext().SpanID() || s.SpanContext().TraceID() != batch.SpanContext().TraceID() {
			t.Errorf("%s is not a child of the batch span", name)
		}
	}
	publish := byName[tracing.SpanPublish][0]
	if publish.SpanKind() != trace.SpanKindProducer {
		t.Errorf("publish span kind %v", publish.SpanKind())
	}
	linked := map[trace.SpanID]int{}
	for _, l := range publish.Links() {
		linked[l.SpanContext.SpanID()]++
	}
	if linked[scA.SpanID()] != 2 || linked[scB.SpanID()] != 1 {
		t.Fatalf("publish links %v, want 2 to the first producer and 1 to the second", linked)
	}
	if publish.Status().Code != codes.Error {
		t.Errorf("publish status %v, want Error for a partial failure", publish.Status())
	}
	var failedEvents int
	for _, e := range publish.Events() {
		if e.Name == "publish failed" {
			failedEvents++
		}
	}
	if failedEvents != 1 {
		t.Errorf("%d 'publish failed' span events, want 1", failedEvents)
	}
	mark := byName[tracing.SpanMark][0]
	attrs := map[string]int64{}
	for _, kv := range mark.Attributes() {
		attrs[string(kv.Key)] = kv.Value.AsInt64()
	}
	if attrs["txoutbox.published"] != 2 || attrs["txoutbox.failed"] != 1 {
		t.Errorf("mark attributes %v", attrs)
	}
}

func TestFailedClaimSpan(t *testing.T) {
	tr, rec, _ := setup(t)
	down := errors.New("connection refused")
	st := downStore{memoutbox.New(memoutbox.Options{}), down}
	if _, err := tr.Store(st).Claim(context.Background(), core.ClaimRequest{Limit: 10}); !errors.Is(err, down) {
		t.Fatalf("Claim: %v", err)
	}
	spans := rec.Ended()
	if len(spans) != 1 || spans[0].Name() != tracing.SpanClaim || spans[0].Status().Code != codes.Error {
		t.Fatalf("spans after a failed claim: %v", spans)
	}
}

// The relay decides from the capabilities of what it is given; a decorator
// must forward all of them, and Stats and DeletePublished too.
func TestDecoratorsKeepCapabilities(t *testing.T) {
	tr, _, _ := setup(t)
	outboxtest.RequireStoreDecorator(t, tr.Store)
	outboxtest.RequirePublisherDecorator(t, tr.Publisher)
}

func TestConsumerContinuesProducerTrace(t *testing.T) {
	tr, rec, app := setup(t)
	evs, producer := produce(t, tr, app, 1, 2)

	var handlerSpan trace.SpanContext
	boom := errors.New("handler failed")
	h := tr.Middleware("billing")(func(msg *message.Message) ([]*message.Message, error) {
		handlerSpan = trace.SpanContextFromContext(msg.Context())
		if msg.Metadata.Get(core.HeaderAggregateID) == "1" {
			return nil, boom
		}
		return nil, nil
	})
	for i := range evs {
		msg := watermillbroker.NewMessage(context.Background(), &evs[i])
		if _, err := h(msg); (err != nil) != (i == 1) {
			t.Fatalf("handler %d: %v", i, err)
		}
		if handlerSpan.TraceID() != producer.TraceID() {
			t.Fatalf("handler ran in trace %s, want the producer's %s", handlerSpan.TraceID(), producer.TraceID())
		}
	}
	var consume []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == tracing.SpanConsume {
			consume = append(consume, s)
		}
	}
	if len(consume) != 2 {
		t.Fatalf("%d consume spans, want 2", len(consume))
	}
	for i, s := range consume {
		if s.Parent().SpanID() != producer.SpanID() || !s.Parent().IsRemote() {
			t.Errorf("consume span %d: parent %v, want the remote producer span %v", i, s.Parent().SpanID(), producer.SpanID())
		}
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("consume span %d kind %v", i, s.SpanKind())
		}
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		if attrs["messaging.message.id"] != evs[i].ID || attrs["messaging.consumer.group.name"] != "billing" {
			t.Errorf("consume span %d attributes %v", i, attrs)
		}
	}
	if consume[0].Status().Code == codes.Error || consume[1].Status().Code != codes.Error {
		t.Errorf("statuses %v, %v; want only the failed handler's span in error", consume[0].Status(), consume[1].Status())
	}
}
