package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"

	"github.com/txoutbox/txoutbox/tracing"
)

// otlpWanted reports whether the standard OpenTelemetry environment asks
// for traces over OTLP: an OTLP endpoint is set, or OTEL_TRACES_EXPORTER is
// otlp; OTEL_SDK_DISABLED=true and OTEL_TRACES_EXPORTER=none turn it off.
func otlpWanted() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(os.Getenv("OTEL_TRACES_EXPORTER")) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// otlpTracing returns the relay's tracing, exporting over OTLP as the
// OTEL_* environment says (endpoint, protocol grpc or http/protobuf,
// headers, timeout, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), and the
// function that flushes and stops it; nil when the environment asks for no
// export.
func (a *app) otlpTracing(ctx context.Context) (*tracing.Tracing, func(context.Context) error, error) {
	if !otlpWanted() {
		return nil, nil, nil
	}
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp sdktrace.SpanExporter
	var err error
	switch protocol {
	case "", "http/protobuf":
		protocol = "http/protobuf"
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, nil, usagef("OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", protocol)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(serviceName())))
	if err != nil {
		return nil, nil, fmt.Errorf("OTLP resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	a.log.Info("txoutbox: exporting traces over OTLP", "protocol", protocol, "service", serviceName())
	return tracing.New(tracing.Options{TracerProvider: tp}), tp.Shutdown, nil
}

// serviceName is OTEL_SERVICE_NAME, else txoutbox-relay.
func serviceName() string {
	if s := os.Getenv("OTEL_SERVICE_NAME"); s != "" {
		return s
	}
	return "txoutbox-relay"
}
