package main

import (
	"context"
	"errors"
	"log/slog"
	"testing"
)

func TestOpenSNSFIFOOnly(t *testing.T) {
	t.Parallel()
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
		if got := p.Capabilities().PreservesAggregateOrder; got != want {
			t.Errorf("openSNS(%s): PreservesAggregateOrder %t, want %t", url, got, want)
		}
		p.Close()
	}
	if _, err := openSNS(ctx, "sns://?region=eu-west-1&create_topics=true&fifo_only=maybe", log); !errors.Is(err, ErrUsage) {
		t.Errorf("fifo_only=maybe: %v, want ErrUsage", err)
	}
}
