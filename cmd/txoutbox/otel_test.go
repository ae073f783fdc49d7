package main

import (
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP trace receiver: it keeps the names of the
// spans and the service names it is sent.
type otlpReceiver struct {
	mu       sync.Mutex
	spans    []string
	services []string
}

func (rc *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.NotFound(w, r)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				rc.services = append(rc.services, kv.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				rc.spans = append(rc.spans, sp.GetName())
			}
		}
	}
	rc.mu.Unlock()
	b, _ = proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(b)
}

// With the standard OTEL_* variables set, the relay exports its traces
// over OTLP: claim, publish and mark spans reach the receiver, under the
// service name given, and are flushed before the process exits.
func TestRelayExportsTracesOverOTLP(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enqueue(t, "order.created", "o-1", 5)
	rc := &otlpReceiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	r := run(t, "", []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + srv.URL, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_SERVICE_NAME=relay-under-test"},
		"relay", "--dsn", f.dsn, "--broker", "log://", "--drain", "--http-addr", "")
	if r.code != 0 {
		t.Fatalf("relay: exit %d\n%s", r.code, r.stderr)
	}
	rc.mu.Lock()
	spans, services := slices.Clone(rc.spans), slices.Clone(rc.services)
	rc.spans = nil
	rc.mu.Unlock()
	for _, want := range []string{"txoutbox.claim", "txoutbox.publish", "txoutbox.batch"} {
		if !slices.Contains(spans, want) {
			t.Errorf("the receiver got spans %v: no %s", spans, want)
		}
	}
	if !slices.Contains(services, "relay-under-test") {
		t.Errorf("service names %v, want relay-under-test", services)
	}
	// Without the variables, nothing is exported.
	f.enqueue(t, "order.created", "o-2", 2)
	if r := run(t, "", nil, "relay", "--dsn", f.dsn, "--broker", "log://", "--drain", "--http-addr", ""); r.code != 0 {
		t.Fatalf("relay: exit %d\n%s", r.code, r.stderr)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.spans) != 0 {
		t.Errorf("without OTEL_* the relay exported %d spans", len(rc.spans))
	}
}
