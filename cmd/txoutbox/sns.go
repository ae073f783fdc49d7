package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"

	snsbroker "github.com/txoutbox/txoutbox/brokers/sns"
)

// openSNS connects to SNS as sns://?region=...&endpoint=...&create_topics=true
// &topic_arn_prefix=...&max_batch_size=10&fifo_only=true says (fifo_only:
// every topic is FIFO, so --ordering auto runs ordered; see
// snsbroker.Options.FIFOOnly). Credentials come from the
// standard AWS chain (environment, profile, instance role), never the URL.
func openSNS(ctx context.Context, rawURL string, log *slog.Logger) (publisher, error) {
	if err := checkBrokerURL(rawURL); err != nil {
		return nil, err
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, usagef("broker %s: %v", redact(rawURL), err)
	}
	q := u.Query()
	ce, err := cloudEvents(q)
	if err != nil {
		return nil, err
	}
	opts := snsbroker.Options{TopicARNPrefix: q.Get("topic_arn_prefix"), CloudEvents: ce, Logger: log}
	if v := q.Get("create_topics"); v != "" {
		if opts.CreateTopics, err = strconv.ParseBool(v); err != nil {
			return nil, usagef("sns:// create_topics=%q is not a boolean", v)
		}
	}
	if v := q.Get("fifo_only"); v != "" {
		if opts.FIFOOnly, err = strconv.ParseBool(v); err != nil {
			return nil, usagef("sns:// fifo_only=%q is not a boolean", v)
		}
	}
	if v := q.Get("max_batch_size"); v != "" {
		if opts.MaxBatchSize, err = strconv.Atoi(v); err != nil {
			return nil, usagef("sns:// max_batch_size=%q is not a number", v)
		}
	}
	if !opts.CreateTopics && opts.TopicARNPrefix == "" {
		return nil, usagef("sns:// needs create_topics=true or topic_arn_prefix=arn:aws:sns:REGION:ACCOUNT: to find topic ARNs")
	}
	client, err := snsbroker.NewClient(ctx, snsbroker.ClientOptions{Region: q.Get("region"), Endpoint: q.Get("endpoint")})
	if err != nil {
		return nil, fmt.Errorf("sns client: %w", err)
	}
	p, err := snsbroker.NewPublisher(client, opts)
	if err != nil {
		return nil, fmt.Errorf("sns publisher: %w", err)
	}
	return p, nil
}
