package main

import (
	"context"
	"encoding/xml"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// TestRelaySNS runs the example once against PostgreSQL and goaws and reads
// the events back from an SQS queue subscribed to the order_created topic
// (raw delivery, so the event's headers are the SQS message's attributes).
func TestRelaySNS(t *testing.T) {
	endpoint := testenv.SNSEndpoint(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	// goaws speaks the query protocol only; plain form posts do.
	call := func(form url.Values, out any) {
		t.Helper()
		resp, err := http.PostForm(endpoint, form)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s: %s", form.Get("Action"), resp.Status, b)
		}
		if out != nil {
			if err := xml.Unmarshal(b, out); err != nil {
				t.Fatalf("%s: %v: %s", form.Get("Action"), err, b)
			}
		}
	}
	var topic struct {
		ARN string `xml:"CreateTopicResult>TopicArn"`
	}
	call(url.Values{"Action": {"CreateTopic"}, "Name": {"order_created"}}, &topic)
	queue := "relay-sns-" + testenv.RandomSuffix()
	var q struct {
		URL string `xml:"CreateQueueResult>QueueUrl"`
	}
	call(url.Values{"Action": {"CreateQueue"}, "QueueName": {queue}}, &q)
	call(url.Values{"Action": {"Subscribe"}, "TopicArn": {topic.ARN}, "Protocol": {"sqs"},
		"Endpoint":               {"arn:aws:sqs:us-east-1:100010001000:" + queue},
		"Attributes.entry.1.key": {"RawMessageDelivery"}, "Attributes.entry.1.value": {"true"}}, nil)

	const n = 7
	res, err := run(ctx, config{
		DSN: testenv.PostgresDSN(t), Endpoint: endpoint, Region: "us-east-1",
		CreateTopics: true, MaxBatch: 1, BatchSize: 100, Migrate: true, Demo: n, Once: true,
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if res.Published != n || res.Failed != 0 {
		t.Fatalf("relay counters %+v, want %d published and no failures", res, n)
	}

	seen := map[string]bool{}
	for len(seen) < n {
		var rr struct {
			Messages []struct {
				Body   string `xml:"Body"`
				Handle string `xml:"ReceiptHandle"`
				Attrs  []struct {
					Name  string `xml:"Name"`
					Value string `xml:"Value>StringValue"`
				} `xml:"MessageAttribute"`
			} `xml:"ReceiveMessageResult>Message"`
		}
		call(url.Values{"Action": {"ReceiveMessage"}, "QueueUrl": {q.URL}, "MaxNumberOfMessages": {"10"}}, &rr)
		for _, m := range rr.Messages {
			attrs := map[string]string{}
			for _, a := range m.Attrs {
				attrs[a.Name] = a.Value
			}
			if attrs["source"] != "relay-sns-demo" || attrs["event_type"] != "order.created" || !strings.Contains(m.Body, attrs["aggregate_id"]) {
				t.Errorf("unexpected message %s with attributes %v", m.Body, attrs)
			}
			seen[attrs["event_id"]] = true
			call(url.Values{"Action": {"DeleteMessage"}, "QueueUrl": {q.URL}, "ReceiptHandle": {m.Handle}}, nil)
		}
		if len(rr.Messages) == 0 {
			select {
			case <-ctx.Done():
				t.Fatalf("%d of %d events arrived", len(seen), n)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}
