package main

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/txoutbox/txoutbox/core"
)

func TestOpenSNSFIFOOnly(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	for url, want := range map[string]bool{
		"sns://?region=eu-west-1&create_topics=true":                 false,
		"sns://?region=eu-west-1&create_topics=true&fifo_only=true":  true,
		"sns://?region=eu-west-1&create_topics=true&fifo_only=false": false,
	} {
		p, err := openSNS(ctx, url, log)
		if err != nil {
			t.Fatalf("openSNS(%s): %v", url, err)
		}
		op, ok := p.(core.OrderingPublisher)
		if !ok || op.PreservesAggregateOrder() != want {
			t.Errorf("openSNS(%s): OrderingPublisher %t, PreservesAggregateOrder want %t", url, ok, want)
		}
		p.Close()
	}
	if _, err := openSNS(ctx, "sns://?region=eu-west-1&create_topics=true&fifo_only=maybe", log); !errors.Is(err, ErrUsage) {
		t.Errorf("fifo_only=maybe: %v, want ErrUsage", err)
	}
}
