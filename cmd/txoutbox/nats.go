package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"time"

	natsbroker "github.com/txoutbox/txoutbox/brokers/nats"
)

// openNATS connects to the JetStream of a nats:// broker URL (checked by
// checkBrokerURL): ?stream= names the stream, ?subjects= creates or updates
// it, ?tls=true dials TLS.
func openNATS(ctx context.Context, rawURL string, log *slog.Logger) (publisher, error) {
	u, _ := url.Parse(rawURL)
	q := u.Query()
	ce, err := cloudEvents(q)
	if err != nil {
		return nil, err
	}
	opts := natsbroker.Options{Stream: q.Get("stream"), StreamSubjects: splitList(q.Get("subjects")), CloudEvents: ce, Logger: log}
	if opts.Stream == "" {
		return nil, usagef("nats:// needs ?stream=NAME, the JetStream stream that stores the events (add &subjects=order.> to create it)")
	}
	for name, d := range map[string]*time.Duration{"duplicate_window": &opts.DuplicateWindow, "ack_timeout": &opts.AckTimeout} {
		if v := q.Get(name); v != "" {
			if *d, err = time.ParseDuration(v); err != nil || *d <= 0 {
				return nil, usagef("nats:// broker: %s=%q is not a positive duration (like 2m)", name, v)
			}
		}
	}
	if v := q.Get("tls"); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return nil, usagef("nats:// broker: tls=%q is not true or false", v)
		}
		if on {
			u.Scheme = "tls"
		}
	}
	if u.Host == "" {
		return nil, usagef("nats:// needs a host:port (nats://127.0.0.1:4222)")
	}
	// The client dials the URL without our parameters.
	u.RawQuery = ""
	opts.URL = u.String()
	p, err := natsbroker.NewPublisher(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact(rawURL), err)
	}
	return p, nil
}
