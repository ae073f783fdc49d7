package main

import (
	"io"
	"log/slog"
	"testing"

	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// The example relays its demo orders from a real PostgreSQL to an
// in-process Kafka cluster.
func TestRunFakeOnce(t *testing.T) {
	n, err := run(t.Context(), config{DSN: testenv.PostgresDSN(t), Fake: true, Demo: 5, Once: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if n.Published != 5 || n.Failed != 0 {
		t.Fatalf("published %d, failed %d; want 5 and 0", n.Published, n.Failed)
	}
}
