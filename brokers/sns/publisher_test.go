package snsbroker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/google/uuid"

	"github.com/txoutbox/txoutbox/brokers/cloudevent"
	snsbroker "github.com/txoutbox/txoutbox/brokers/sns"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/cetest"
	"github.com/txoutbox/txoutbox/internal/testkit/sqstest"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// events makes n events of one type over aggs aggregates.
func events(t *testing.T, eventType string, n, aggs int) []core.Event {
	t.Helper()
	evs := make([]core.Event, n)
	for i := range evs {
		ev, err := core.NewEvent("order", fmt.Sprintf("agg-%d", i%aggs), eventType, map[string]any{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		ev.ID = uuid.Must(uuid.NewV7()).String()
		evs[i] = ev
	}
	return evs
}

func byEventID(ds []sqstest.Delivered) map[string]int {
	m := map[string]int{}
	for _, d := range ds {
		m[d.Headers[core.HeaderEventID]]++
	}
	return m
}

func newPublisher(t *testing.T, api snsbroker.API, opts snsbroker.Options) *snsbroker.Publisher {
	t.Helper()
	p, err := snsbroker.NewPublisher(api, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ctxTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// batchErrs returns the per-event errors of a Publish result.
func batchErrs(t *testing.T, err error, n int) []error {
	t.Helper()
	var be *core.BatchError
	if err != nil && !errors.As(err, &be) {
		t.Fatalf("Publish returned %v, want nil or a *core.BatchError", err)
	}
	errs := core.EventErrors(err, n)
	return errs
}

// TestAttributesOnTheWire publishes events with more headers than SNS
// delivers, and headers that cannot be attributes, to goaws and reads them
// back from SQS, with and without raw message delivery.
func TestAttributesOnTheWire(t *testing.T) {
	for _, raw := range []bool{true, false} {
		t.Run(fmt.Sprintf("raw=%t", raw), func(t *testing.T) {
			t.Parallel()
			g := sqstest.New(t)
			ctx := ctxTimeout(t)
			topic := "attrs-" + testenv.RandomSuffix()
			topicARN, queueURL := g.SubscribeQueue(t, ctx, topic, raw)
			pub := newPublisher(t, g.SNS, snsbroker.Options{TopicARNs: map[string]string{topic: topicARN}, MaxBatchSize: 1,
				Topic: func(*core.Event) string { return topic }})

			evs := events(t, "order.created", 3, 3)
			// Few headers: all are attributes, no overflow.
			evs[0].Headers = map[string]string{"traceparent": "00-abc-def-01", "tenant": "t1"}
			// Too many headers, and some no attribute can carry.
			evs[1].Headers = map[string]string{"empty": "", "x:colon": "c", "AWS.reserved": "r", "ctl": "a\x01b", "txoutbox_headers": "spoof"}
			for i := range 12 {
				evs[1].Headers[fmt.Sprintf("h%02d", i)] = fmt.Sprintf("v%d", i)
			}
			// Exactly ten attributes: four identity and six own.
			evs[2].Headers = map[string]string{}
			for i := range 6 {
				evs[2].Headers[fmt.Sprintf("k%d", i)] = "v"
			}
			if err := pub.Publish(ctx, evs); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			got := g.Drain(t, ctx, queueURL, raw, topicARN, len(evs), 300*time.Millisecond)
			if len(got) != len(evs) {
				t.Fatalf("got %d messages, want %d", len(got), len(evs))
			}
			for _, d := range got {
				i := slices.IndexFunc(evs, func(ev core.Event) bool { return ev.ID == d.Headers[core.HeaderEventID] })
				if i < 0 {
					t.Fatalf("unknown message %v", d.Headers)
				}
				ev := evs[i]
				if want := ev.MessageHeaders(); !maps.Equal(d.Headers, want) {
					t.Errorf("event %d: headers\n got %v\nwant %v", i, d.Headers, want)
				}
				if d.Payload != string(ev.Payload) {
					t.Errorf("event %d: payload %q, want %q", i, d.Payload, ev.Payload)
				}
				attrs := d.SQSAttrs
				if !raw {
					attrs = d.Envelope.Attributes()
				}
				if len(attrs) > snsbroker.MaxAttributes {
					t.Errorf("event %d: %d attributes, SNS delivers at most %d", i, len(attrs), snsbroker.MaxAttributes)
				}
				for _, k := range []string{core.HeaderEventID, core.HeaderEventType, core.HeaderAggregateType, core.HeaderAggregateID} {
					if attrs[k] == "" {
						t.Errorf("event %d: identity header %s is not an attribute of its own: %v", i, k, attrs)
					}
				}
				_, overflow := attrs[snsbroker.DefaultOverflowAttribute]
				if overflow != (i == 1) {
					t.Errorf("event %d: overflow attribute present = %t, want %t (%v)", i, overflow, i == 1, attrs)
				}
				if i == 1 {
					// Nine own attributes: identity first, then h00.. in order.
					for _, k := range []string{"h00", "h01", "h02", "h03", "h04"} {
						if attrs[k] == "" {
							t.Errorf("event 1: %s should be an attribute: %v", k, attrs)
						}
					}
					var packed map[string]string
					if err := json.Unmarshal([]byte(attrs[snsbroker.DefaultOverflowAttribute]), &packed); err != nil {
						t.Fatal(err)
					}
					for _, k := range []string{"empty", "x:colon", "AWS.reserved", "ctl", "txoutbox_headers", "h11"} {
						if _, ok := packed[k]; !ok {
							t.Errorf("event 1: %s should be packed: %v", k, packed)
						}
					}
				}
			}
		})
	}
}

// TestBatchPartialFailure: SNS refuses some entries of PublishBatch calls;
// exactly those are reported, the others arrive once, and publishing the
// failed ones again (as the relay does) delivers them.
func TestBatchPartialFailure(t *testing.T) {
	t.Parallel()
	g := sqstest.New(t)
	f := newFront(t, g.Endpoint)
	ctx := ctxTimeout(t)
	topic := "partial-" + testenv.RandomSuffix()
	topicARN, queueURL := g.SubscribeQueue(t, ctx, topic, true)
	pub := newPublisher(t, newSNSClient(t, f.URL()), snsbroker.Options{CreateTopics: true, Topic: func(*core.Event) string { return topic }})

	evs := events(t, "order.created", 25, 5)
	fail := map[string]bool{evs[0].ID: true, evs[13].ID: true, evs[24].ID: true}
	f.set(func(f *front) {
		f.failWith = func(e sentEntry) (string, bool, bool) {
			return "InternalError", false, fail[e.Attributes[core.HeaderEventID]]
		}
	})
	err := pub.Publish(ctx, evs)
	if err == nil {
		t.Fatal("Publish = nil, want a *core.BatchError")
	}
	errs := batchErrs(t, err, len(evs))
	for i, ev := range evs {
		if fail[ev.ID] {
			var ee *snsbroker.EntryError
			if !errors.Is(errs[i], snsbroker.ErrEntryFailed) || !errors.As(errs[i], &ee) || ee.Code != "InternalError" || ee.SenderFault {
				t.Errorf("event %d: error %v, want an EntryError InternalError", i, errs[i])
			}
		} else if errs[i] != nil {
			t.Errorf("event %d: error %v, want nil", i, errs[i])
		}
	}
	var sizes []int
	for _, b := range f.Batches() {
		sizes = append(sizes, len(b))
	}
	if !slices.Equal(sizes, []int{10, 10, 5}) {
		t.Errorf("PublishBatch sizes %v, want [10 10 5]", sizes)
	}
	if n := f.Calls("Publish"); n != 0 {
		t.Errorf("%d Publish calls, want none: the batch must go through PublishBatch", n)
	}
	got := byEventID(g.Drain(t, ctx, queueURL, true, topicARN, 22, 300*time.Millisecond))
	for _, ev := range evs {
		if want := map[bool]int{true: 0, false: 1}[fail[ev.ID]]; got[ev.ID] != want {
			t.Errorf("event %s delivered %d times, want %d", ev.ID, got[ev.ID], want)
		}
	}

	// The relay retries the failed ones; SNS takes them now.
	f.set(func(f *front) { f.failWith = nil })
	var retry []core.Event
	for _, ev := range evs {
		if fail[ev.ID] {
			retry = append(retry, ev)
		}
	}
	if err := pub.Publish(ctx, retry); err != nil {
		t.Fatalf("retry: %v", err)
	}
	got = byEventID(g.Drain(t, ctx, queueURL, true, topicARN, len(retry), 300*time.Millisecond))
	for _, ev := range retry {
		if got[ev.ID] != 1 {
			t.Errorf("retried event %s delivered %d times, want 1", ev.ID, got[ev.ID])
		}
	}
	if len(got) != len(retry) {
		t.Errorf("after the retry %d messages arrived, want %d", len(got), len(retry))
	}
}

// TestBatchUnconfirmed: an entry SNS lists neither as successful nor as
// failed is not reported as published.
func TestBatchUnconfirmed(t *testing.T) {
	t.Parallel()
	g := sqstest.New(t)
	f := newFront(t, g.Endpoint)
	ctx := ctxTimeout(t)
	pub := newPublisher(t, newSNSClient(t, f.URL()), snsbroker.Options{CreateTopics: true,
		Topic: func(*core.Event) string { return "unconfirmed-" + testenv.RandomSuffix()[:4] }})
	evs := events(t, "order.created", 4, 4)
	f.set(func(f *front) {
		f.drop = func(e sentEntry) bool { return e.Attributes[core.HeaderEventID] == evs[2].ID }
	})
	errs := batchErrs(t, pub.Publish(ctx, evs), len(evs))
	for i := range evs {
		if wantErr := i == 2; (errs[i] != nil) != wantErr || wantErr && !errors.Is(errs[i], snsbroker.ErrNotConfirmed) {
			t.Errorf("event %d: error %v", i, errs[i])
		}
	}
}

// TestBatchCallFailure: a PublishBatch call that fails as a whole fails its
// events only; the other calls of the batch still go out.
func TestBatchCallFailure(t *testing.T) {
	t.Parallel()
	g := sqstest.New(t)
	f := newFront(t, g.Endpoint)
	ctx := ctxTimeout(t)
	topic := "callfail-" + testenv.RandomSuffix()
	topicARN, queueURL := g.SubscribeQueue(t, ctx, topic, true)
	pub := newPublisher(t, newSNSClient(t, f.URL()), snsbroker.Options{CreateTopics: true, Topic: func(*core.Event) string { return topic }})
	evs := events(t, "order.created", 25, 5)
	f.set(func(f *front) {
		f.failCall = func(entries []sentEntry) (int, string, bool) {
			return 403, "AuthorizationError", entries[0].Attributes[core.HeaderEventID] == evs[10].ID
		}
	})
	errs := batchErrs(t, pub.Publish(ctx, evs), len(evs))
	for i := range evs {
		if wantErr := i >= 10 && i < 20; (errs[i] != nil) != wantErr || wantErr && !strings.Contains(errs[i].Error(), "AuthorizationError") {
			t.Errorf("event %d: error %v", i, errs[i])
		}
	}
	got := byEventID(g.Drain(t, ctx, queueURL, true, topicARN, 15, 300*time.Millisecond))
	if len(got) != 15 || got[evs[10].ID] != 0 || got[evs[9].ID] != 1 || got[evs[20].ID] != 1 {
		t.Errorf("delivered %v, want the 15 events outside the failed call", got)
	}
}

// TestFIFO: on a FIFO topic, group = aggregate ID and deduplication ID =
// event ID, in PublishBatch and in Publish; after a failure the group's
// later events are held back, other groups go on.
func TestFIFO(t *testing.T) {
	t.Parallel()
	g := sqstest.New(t)
	f := newFront(t, g.Endpoint)
	ctx := ctxTimeout(t)
	topic := "fifo-" + testenv.RandomSuffix() + ".fifo"
	topicARN, queueURL := g.SubscribeQueue(t, ctx, topic, true)
	client := newSNSClient(t, f.URL())
	pub := newPublisher(t, client, snsbroker.Options{CreateTopics: true, Topic: func(*core.Event) string { return topic }})
	evs := events(t, "order.created", 24, 3) // agg-0, agg-1, agg-2, agg-0, ...
	failID := evs[4].ID                      // agg-1's second event, in the first call
	f.set(func(f *front) {
		f.failWith = func(e sentEntry) (string, bool, bool) {
			return "InternalError", false, e.DedupID == failID
		}
	})
	errs := batchErrs(t, pub.Publish(ctx, evs), len(evs))
	for i, ev := range evs {
		switch {
		case ev.ID == failID:
			if !errors.Is(errs[i], snsbroker.ErrEntryFailed) {
				t.Errorf("event %d: %v, want ErrEntryFailed", i, errs[i])
			}
		case ev.AggregateID == "agg-1" && i >= 10:
			// The calls after the failure hold agg-1 back.
			if !errors.Is(errs[i], snsbroker.ErrEarlierFailed) {
				t.Errorf("event %d (%s): %v, want ErrEarlierFailed", i, ev.AggregateID, errs[i])
			}
		case ev.AggregateID == "agg-1" && i > 4:
			// Same call as the failure: SNS decided, and took it.
			if errs[i] != nil {
				t.Errorf("event %d (%s, same call): %v", i, ev.AggregateID, errs[i])
			}
		default:
			if errs[i] != nil {
				t.Errorf("event %d (%s): %v", i, ev.AggregateID, errs[i])
			}
		}
	}
	sent := map[string]sentEntry{}
	for _, b := range f.Batches() {
		for _, e := range b {
			sent[e.DedupID] = e
		}
	}
	for i, ev := range evs {
		e, ok := sent[ev.ID]
		if ok != (errs[i] == nil || ev.ID == failID) {
			t.Errorf("event %d: sent = %t with error %v", i, ok, errs[i])
		}
		if ok && (e.GroupID != ev.AggregateID || e.Attributes[core.HeaderEventID] != ev.ID) {
			t.Errorf("event %d: MessageGroupId %q, MessageDeduplicationId %q, want %q, %q", i, e.GroupID, e.DedupID, ev.AggregateID, ev.ID)
		}
	}
	want := 0
	for _, err := range errs {
		if err == nil {
			want++
		}
	}
	got := g.Drain(t, ctx, queueURL, true, topicARN, want, 300*time.Millisecond)
	if len(got) != want {
		t.Errorf("%d messages arrived, want %d", len(got), want)
	}

	// Publish (MaxBatchSize 1) sets the same fields.
	one := newPublisher(t, client, snsbroker.Options{CreateTopics: true, MaxBatchSize: 1, Topic: func(*core.Event) string { return topic }})
	f.set(func(f *front) { f.failWith = nil })
	if err := one.Publish(ctx, evs[:2]); err != nil {
		t.Fatal(err)
	}
	singles := f.Singles()
	if len(singles) != 2 {
		t.Fatalf("%d Publish calls, want 2", len(singles))
	}
	for i, s := range singles {
		if s.GroupID != evs[i].AggregateID || s.DedupID != evs[i].ID {
			t.Errorf("Publish %d: group %q dedup %q, want %q %q", i, s.GroupID, s.DedupID, evs[i].AggregateID, evs[i].ID)
		}
	}
	g.Drain(t, ctx, queueURL, true, topicARN, 2, 0)
}

// TestSizeLimits: an event over 256 KiB fails alone without being sent, and
// PublishBatch calls stay under 256 KiB in total.
func TestSizeLimits(t *testing.T) {
	t.Parallel()
	g := sqstest.New(t)
	f := newFront(t, g.Endpoint)
	ctx := ctxTimeout(t)
	topic := "size-" + testenv.RandomSuffix()
	topicARN, queueURL := g.SubscribeQueue(t, ctx, topic, true)
	pub := newPublisher(t, newSNSClient(t, f.URL()), snsbroker.Options{CreateTopics: true, Topic: func(*core.Event) string { return topic }})
	evs := events(t, "order.created", 6, 6)
	big := func(n int) json.RawMessage { return json.RawMessage(`"` + strings.Repeat("x", n) + `"`) }
	for i := range evs {
		evs[i].Payload = big(100 * 1024)
	}
	evs[3].Payload = big(snsbroker.MaxMessageBytes)
	errs := batchErrs(t, pub.Publish(ctx, evs), len(evs))
	for i := range evs {
		if wantErr := i == 3; (errs[i] != nil) != wantErr || wantErr && !errors.Is(errs[i], snsbroker.ErrMessageTooLarge) {
			t.Errorf("event %d: %v", i, errs[i])
		}
	}
	var sizes []int
	for _, b := range f.Batches() {
		sizes = append(sizes, len(b))
	}
	if !slices.Equal(sizes, []int{2, 2, 1}) {
		t.Errorf("PublishBatch sizes %v, want [2 2 1] (100 KiB events, 256 KiB per call)", sizes)
	}
	got := g.Drain(t, ctx, queueURL, true, topicARN, 5, 300*time.Millisecond)
	if len(got) != 5 {
		t.Errorf("%d messages arrived, want 5", len(got))
	}
}

// TestTopicResolution: TopicARNs, TopicARNPrefix, ARNs as topics,
// CreateTopics with its cache, and the error when nothing resolves.
func TestTopicResolution(t *testing.T) {
	t.Parallel()
	g := sqstest.New(t)
	f := newFront(t, g.Endpoint)
	ctx := ctxTimeout(t)
	client := newSNSClient(t, f.URL())
	suffix := testenv.RandomSuffix()
	mapped, mappedQ := g.SubscribeQueue(t, ctx, "mapped-"+suffix, true)
	prefixed, prefixedQ := g.SubscribeQueue(t, ctx, "prefixed-"+suffix, true)
	direct, directQ := g.SubscribeQueue(t, ctx, "direct-"+suffix, true)
	created, createdQ := g.SubscribeQueue(t, ctx, "order_created_"+suffix, true)
	createTopicsBefore := f.Calls("CreateTopic")

	pub := newPublisher(t, client, snsbroker.Options{
		TopicARNs:      map[string]string{"order.mapped": mapped},
		TopicARNPrefix: strings.TrimSuffix(prefixed, "prefixed-"+suffix),
		Topic: func(ev *core.Event) string {
			switch ev.EventType {
			case "order.mapped":
				return "order.mapped"
			case "order.direct":
				return direct
			}
			return "prefixed-" + suffix
		},
	})
	evs := append(append(events(t, "order.mapped", 1, 1), events(t, "order.direct", 1, 1)...), events(t, "order.prefixed", 1, 1)...)
	if err := pub.Publish(ctx, evs); err != nil {
		t.Fatal(err)
	}
	for i, q := range []struct{ arn, url string }{{mapped, mappedQ}, {direct, directQ}, {prefixed, prefixedQ}} {
		got := g.Drain(t, ctx, q.url, true, q.arn, 1, 200*time.Millisecond)
		if len(got) != 1 || got[0].Headers[core.HeaderEventID] != evs[i].ID {
			t.Errorf("topic %s: got %v, want event %d", q.arn, got, i)
		}
	}
	if n := f.Calls("CreateTopic") - createTopicsBefore; n != 0 {
		t.Errorf("%d CreateTopic calls without CreateTopics", n)
	}

	// CreateTopics, default topic names: one CreateTopic, then the cache.
	auto := newPublisher(t, client, snsbroker.Options{CreateTopics: true})
	for range 3 {
		if err := auto.Publish(ctx, events(t, "order.created."+suffix, 2, 2)); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.Calls("CreateTopic") - createTopicsBefore; n != 1 {
		t.Errorf("%d CreateTopic calls for one topic, want 1", n)
	}
	if got := g.Drain(t, ctx, createdQ, true, created, 6, 200*time.Millisecond); len(got) != 6 {
		t.Errorf("%d messages on %s, want 6", len(got), created)
	}

	none := newPublisher(t, client, snsbroker.Options{})
	calls := f.Calls("PublishBatch")
	errs := batchErrs(t, none.Publish(ctx, events(t, "order.nowhere", 2, 1)), 2)
	for i, err := range errs {
		if !errors.Is(err, snsbroker.ErrUnknownTopic) {
			t.Errorf("event %d: %v, want ErrUnknownTopic", i, err)
		}
	}
	if f.Calls("PublishBatch") != calls {
		t.Error("events without a topic ARN were sent")
	}
}

// TestMessagePublisher: the Watermill face publishes messages whose UUID,
// metadata and payload arrive, through PublishBatch.
func TestMessagePublisher(t *testing.T) {
	t.Parallel()
	g := sqstest.New(t)
	f := newFront(t, g.Endpoint)
	ctx := ctxTimeout(t)
	topic := "watermill-" + testenv.RandomSuffix()
	topicARN, queueURL := g.SubscribeQueue(t, ctx, topic, false)
	p := newPublisher(t, newSNSClient(t, f.URL()), snsbroker.Options{CreateTopics: true})
	var mp message.Publisher = p.MessagePublisher()
	var msgs []*message.Message
	for i := range 12 {
		m := message.NewMessage(uuid.NewString(), []byte(fmt.Sprintf(`{"i":%d}`, i)))
		m.Metadata.Set("color", "blue")
		m.SetContext(ctx)
		msgs = append(msgs, m)
	}
	if err := mp.Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
	if n := f.Calls("PublishBatch"); n != 2 {
		t.Errorf("%d PublishBatch calls for 12 messages, want 2", n)
	}
	got := g.Drain(t, ctx, queueURL, false, topicARN, len(msgs), 300*time.Millisecond)
	want := map[string]string{}
	for _, m := range msgs {
		want[m.UUID] = string(m.Payload)
	}
	for _, d := range got {
		if want[d.Headers[core.HeaderEventID]] != d.Payload || d.Headers["color"] != "blue" {
			t.Errorf("unexpected message %+v", d)
		}
		delete(want, d.Headers[core.HeaderEventID])
	}
	if len(want) != 0 {
		t.Errorf("never arrived: %v", want)
	}
	if err := mp.Publish("", message.NewMessage(uuid.NewString(), []byte("{}"))); !errors.Is(err, snsbroker.ErrUnknownTopic) {
		t.Errorf("Publish to an empty topic = %v, want ErrUnknownTopic", err)
	}
	if err := mp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := mp.Publish(topic, message.NewMessage(uuid.NewString(), []byte("{}"))); !errors.Is(err, core.ErrClosed) {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
	if err := p.Publish(ctx, events(t, "x", 1, 1)); !errors.Is(err, core.ErrClosed) {
		t.Errorf("Publisher.Publish after Close = %v, want ErrClosed", err)
	}
}

// TestCancelledContext: nothing is sent with a cancelled context, and every
// event reports the context's error.
func TestCancelledContext(t *testing.T) {
	t.Parallel()
	g := sqstest.New(t)
	f := newFront(t, g.Endpoint)
	pub := newPublisher(t, newSNSClient(t, f.URL()), snsbroker.Options{TopicARNPrefix: "arn:aws:sns:us-east-1:100010001000:"})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for i, err := range batchErrs(t, pub.Publish(ctx, events(t, "order.created", 12, 2)), 12) {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("event %d: %v, want context.Canceled", i, err)
		}
	}
	if n := f.Calls("PublishBatch"); n != 0 {
		t.Errorf("%d PublishBatch calls with a cancelled context", n)
	}
}

func TestOptionsValidation(t *testing.T) {
	client := sns.New(sns.Options{Region: "us-east-1", BaseEndpoint: aws.String("http://127.0.0.1:1")})
	for name, o := range map[string]snsbroker.Options{
		"MaxBatchSize>10":  {MaxBatchSize: 11},
		"MaxBatchSize<0":   {MaxBatchSize: -1},
		"MaxAttributes<5":  {MaxAttributes: 4},
		"MaxAttributes>10": {MaxAttributes: 11},
		"OverflowName":     {OverflowAttribute: "AWS.x"},
		"Concurrency<0":    {Concurrency: -1},
	} {
		if _, err := snsbroker.NewPublisher(client, o); !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("%s: New = %v, want ErrInvalidOptions", name, err)
		}
	}
	if _, err := snsbroker.NewPublisher(nil, snsbroker.Options{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("NewPublisher(nil) = %v, want ErrInvalidOptions", err)
	}
	if _, err := snsbroker.NewPublisher(client, snsbroker.Options{}); err != nil {
		t.Errorf("New with zero Options: %v", err)
	}
}

// TestConcurrency: with Concurrency, the calls for a standard topic overlap;
// those for a FIFO topic never do.
func TestConcurrency(t *testing.T) {
	for _, fifo := range []bool{false, true} {
		t.Run(fmt.Sprintf("fifo=%t", fifo), func(t *testing.T) {
			t.Parallel()
			g := sqstest.New(t)
			f := newFront(t, g.Endpoint)
			f.set(func(f *front) { f.delay = 200 * time.Millisecond })
			ctx := ctxTimeout(t)
			topic := "conc-" + testenv.RandomSuffix()
			if fifo {
				topic += ".fifo"
			}
			topicARN, queueURL := g.SubscribeQueue(t, ctx, topic, true)
			pub := newPublisher(t, newSNSClient(t, f.URL()), snsbroker.Options{CreateTopics: true, Concurrency: 4,
				Topic: func(*core.Event) string { return topic }})
			evs := events(t, "order.created", 60, 4) // six calls
			if err := pub.Publish(ctx, evs); err != nil {
				t.Fatal(err)
			}
			n := f.MaxInFlight()
			if fifo && n != 1 || !fifo && (n < 2 || n > 4) {
				t.Errorf("%d PublishBatch calls in flight at most; want 1 on a FIFO topic, 2 to 4 (Concurrency) otherwise", n)
			}
			got := byEventID(g.Drain(t, ctx, queueURL, true, topicARN, len(evs), 300*time.Millisecond))
			for _, ev := range evs {
				if got[ev.ID] != 1 {
					t.Errorf("event %s delivered %d times", ev.ID, got[ev.ID])
				}
			}
		})
	}
}

// TestFIFOHoldsBehindBadEvent: an event that cannot be sent at all (too
// large) holds back its group's later events on a FIFO topic, not its
// earlier ones, and not other groups.
func TestFIFOHoldsBehindBadEvent(t *testing.T) {
	t.Parallel()
	g := sqstest.New(t)
	f := newFront(t, g.Endpoint)
	ctx := ctxTimeout(t)
	topic := "fifobad-" + testenv.RandomSuffix() + ".fifo"
	topicARN, queueURL := g.SubscribeQueue(t, ctx, topic, true)
	pub := newPublisher(t, newSNSClient(t, f.URL()), snsbroker.Options{CreateTopics: true, Topic: func(*core.Event) string { return topic }})
	evs := events(t, "order.created", 6, 2) // agg-0, agg-1, agg-0, ...
	evs[2].Payload = json.RawMessage(`"` + strings.Repeat("x", snsbroker.MaxMessageBytes) + `"`)
	errs := batchErrs(t, pub.Publish(ctx, evs), len(evs))
	for i, want := range []error{nil, nil, snsbroker.ErrMessageTooLarge, nil, snsbroker.ErrEarlierFailed, nil} {
		if want == nil && errs[i] != nil || want != nil && !errors.Is(errs[i], want) {
			t.Errorf("event %d (%s): %v, want %v", i, evs[i].AggregateID, errs[i], want)
		}
	}
	if got := g.Drain(t, ctx, queueURL, true, topicARN, 4, 300*time.Millisecond); len(got) != 4 {
		t.Errorf("%d messages arrived, want 4", len(got))
	}
}

// With CloudEvents on, what the subscribed SQS queue receives is each event
// as a CloudEvent ("ce-" message attributes in binary mode, which the
// overflow attribute carries past SQS's ten; the JSON event in structured
// mode), as the SDK decodes it from the raw message.
func TestCloudEvents(t *testing.T) {
	for _, mode := range cetest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			g := sqstest.New(t)
			ctx := ctxTimeout(t)
			topic := "ce-" + testenv.RandomSuffix()
			topicARN, queueURL := g.SubscribeQueue(t, ctx, topic, true)
			pub := newPublisher(t, g.SNS, snsbroker.Options{TopicARNs: map[string]string{topic: topicARN}, MaxBatchSize: 1,
				Topic: func(*core.Event) string { return topic }, CloudEvents: &cloudevent.Options{Source: cetest.Source, Mode: mode}})
			evs := events(t, "order.created", 3, 3)
			for i := range evs {
				evs[i].CreatedAt = time.Now().UTC().Truncate(time.Microsecond)
			}
			if err := pub.Publish(ctx, evs); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			got := g.Drain(t, ctx, queueURL, true, topicARN, len(evs), 300*time.Millisecond)
			if len(got) != len(evs) {
				t.Fatalf("got %d messages, want %d", len(got), len(evs))
			}
			for _, d := range got {
				i := slices.IndexFunc(evs, func(ev core.Event) bool { return ev.ID == d.Headers[core.HeaderEventID] })
				if i < 0 {
					t.Fatalf("unknown message %v", d.Headers)
				}
				cetest.Check(t, cloudevent.SNS, evs[i], d.Headers, []byte(d.Payload), "")
			}
		})
	}
}
