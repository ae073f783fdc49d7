package tracing_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/tracing"
)

// The producer's trace travels in the event headers to the consumer.
func Example() {
	tp := sdktrace.NewTracerProvider() // your application's provider, with an exporter
	tr := tracing.New(tracing.Options{TracerProvider: tp})

	// Producer: pass tr.EnqueueHook() to the adapter (sqlxoutbox.Options.Hooks);
	// here it runs by hand on one event.
	ctx, producer := tp.Tracer("app").Start(context.Background(), "POST /orders")
	evs := []core.Event{{EventType: "order.created", AggregateID: "42"}}
	if err := core.PrepareEvents(ctx, evs, core.Limits{}, []core.EnqueueHook{tr.EnqueueHook()}); err != nil {
		panic(err)
	}
	producer.End()

	// Relay: core.NewRelay(tr.Store(outbox), tr.Publisher(pub), ...).
	// Consumer: router.AddMiddleware(tr.Middleware("billing")), before the
	// inbox middleware.
	handler := tr.Middleware("billing")(func(msg *message.Message) ([]*message.Message, error) {
		same := trace.SpanContextFromContext(msg.Context()).TraceID() == producer.SpanContext().TraceID()
		fmt.Println("consumer in the producer's trace:", same)
		return nil, nil
	})
	if _, err := handler(watermillbroker.NewMessage(context.Background(), &evs[0])); err != nil {
		panic(err)
	}
	// Output:
	// consumer in the producer's trace: true
}
