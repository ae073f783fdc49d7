// Package sqstest reads what SNS delivered from SQS queues of the goaws
// emulator that make test starts, for the SNS broker's tests and the fault
// matrix.
//
// goaws v0.4.5 speaks only the query protocol (it routes on the form field
// Action), while aws-sdk-go-v2/service/sqs has spoken JSON 1.0 since v1.29
// (go.mod holds v1.53.0, shared with the rest of the module, so an older
// version is not an option). So this package is a small SQS query-protocol
// client over plain HTTP, and a Watermill message.Subscriber on top of it.
package sqstest

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sns"

	snsbroker "github.com/txoutbox/txoutbox/brokers/sns"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// Client is an SQS client speaking the query protocol.
type Client struct {
	Endpoint string       // the emulator's URL
	HTTP     *http.Client // with a timeout
}

// Message is one received SQS message.
type Message struct {
	MessageID     string
	ReceiptHandle string
	Body          string
	Attributes    map[string]string // message attributes (raw delivery)
}

func (q *Client) call(ctx context.Context, form url.Values, out any) error {
	form.Set("Version", "2012-11-05")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, q.Endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := q.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("sqs %s: %w", form.Get("Action"), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("sqs %s: read: %w", form.Get("Action"), err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("sqs %s: %s: %s", form.Get("Action"), resp.Status, body)
	}
	if out == nil {
		return nil
	}
	if err := xml.Unmarshal(body, out); err != nil {
		return fmt.Errorf("sqs %s: decode %q: %w", form.Get("Action"), body, err)
	}
	return nil
}

// CreateQueue makes a queue with the given attributes (such as
// VisibilityTimeout) and returns its URL and ARN.
func (q *Client) CreateQueue(ctx context.Context, name string, attrs map[string]string) (queueURL, arn string, err error) {
	var cr struct {
		QueueURL string `xml:"CreateQueueResult>QueueUrl"`
	}
	form := url.Values{"Action": {"CreateQueue"}, "QueueName": {name}}
	n := 0
	for k, v := range attrs {
		n++
		form.Set(fmt.Sprintf("Attribute.%d.Name", n), k)
		form.Set(fmt.Sprintf("Attribute.%d.Value", n), v)
	}
	if err := q.call(ctx, form, &cr); err != nil {
		return "", "", err
	}
	var ar struct {
		Attrs []struct {
			Name  string `xml:"Name"`
			Value string `xml:"Value"`
		} `xml:"GetQueueAttributesResult>Attribute"`
	}
	if err := q.call(ctx, url.Values{"Action": {"GetQueueAttributes"}, "QueueUrl": {cr.QueueURL}, "AttributeName.1": {"QueueArn"}}, &ar); err != nil {
		return "", "", err
	}
	for _, a := range ar.Attrs {
		if a.Name == "QueueArn" {
			return cr.QueueURL, a.Value, nil
		}
	}
	return "", "", fmt.Errorf("sqs: no QueueArn for %s", name)
}

// Receive takes up to max messages of the queue, with their attributes.
func (q *Client) Receive(ctx context.Context, queueURL string, max int) ([]Message, error) {
	var rr struct {
		Messages []struct {
			MessageID     string `xml:"MessageId"`
			ReceiptHandle string `xml:"ReceiptHandle"`
			Body          string `xml:"Body"`
			Attrs         []struct {
				Name        string `xml:"Name"`
				DataType    string `xml:"Value>DataType"`
				StringValue string `xml:"Value>StringValue"`
			} `xml:"MessageAttribute"`
		} `xml:"ReceiveMessageResult>Message"`
	}
	form := url.Values{"Action": {"ReceiveMessage"}, "QueueUrl": {queueURL}, "MaxNumberOfMessages": {strconv.Itoa(max)},
		"MessageAttributeName.1": {"All"}}
	if err := q.call(ctx, form, &rr); err != nil {
		return nil, err
	}
	out := make([]Message, len(rr.Messages))
	for i, m := range rr.Messages {
		attrs := map[string]string{}
		for _, a := range m.Attrs {
			attrs[a.Name] = a.StringValue
		}
		out[i] = Message{MessageID: m.MessageID, ReceiptHandle: m.ReceiptHandle, Body: m.Body, Attributes: attrs}
	}
	return out, nil
}

// Delete removes a received message from the queue (its ack).
func (q *Client) Delete(ctx context.Context, queueURL, handle string) error {
	return q.call(ctx, url.Values{"Action": {"DeleteMessage"}, "QueueUrl": {queueURL}, "ReceiptHandle": {handle}}, nil)
}

// Release makes a received message visible again at once (its nack).
func (q *Client) Release(ctx context.Context, queueURL, handle string) error {
	return q.call(ctx, url.Values{"Action": {"ChangeMessageVisibility"}, "QueueUrl": {queueURL}, "ReceiptHandle": {handle}, "VisibilityTimeout": {"0"}}, nil)
}

// ReceiveMax is how many messages one ReceiveMessage asks for. On a FIFO
// queue goaws v0.4.5 hides every message it looks at while the message
// group is locked, then returns only the first, so the others stay
// invisible until their visibility timeout: ask for one at a time there.
func ReceiveMax(queueURL string) int {
	if snsbroker.IsFIFO(queueURL) {
		return 1
	}
	return 10
}

// Delivered is one message as a consumer sees it: payload and restored
// headers, plus what SQS and SNS said about it.
type Delivered struct {
	Payload  string
	Headers  map[string]string
	SQSAttrs map[string]string // message attributes on the SQS message itself
	Envelope *snsbroker.Notification
}

// Decode turns an SQS message from an SNS subscription into a delivered
// message, checking the envelope (raw == false) or its absence.
func Decode(m Message, raw bool, topicARN string) (Delivered, error) {
	d := Delivered{SQSAttrs: m.Attributes}
	attrs := m.Attributes
	if raw {
		if _, err := snsbroker.ParseNotification([]byte(m.Body)); err == nil {
			return d, fmt.Errorf("raw delivery, but the body is an SNS envelope: %s", m.Body)
		}
		d.Payload = m.Body
	} else {
		n, err := snsbroker.ParseNotification([]byte(m.Body))
		if err != nil {
			return d, err
		}
		if n.TopicArn != topicARN {
			return d, fmt.Errorf("envelope TopicArn %q, want %q", n.TopicArn, topicARN)
		}
		if len(m.Attributes) != 0 {
			return d, fmt.Errorf("envelope delivery, but the SQS message has attributes %v", m.Attributes)
		}
		d.Envelope = n
		d.Payload = n.Message
		attrs = n.Attributes()
	}
	h, err := snsbroker.DecodeHeaders(attrs, "")
	if err != nil {
		return d, err
	}
	d.Headers = h
	return d, nil
}

// Goaws is the emulator of make test, with clients for it.
type Goaws struct {
	Endpoint string
	SNS      *sns.Client
	SQS      *Client
	// VisibilityTimeout is the seconds a received message of the queues
	// SubscribeQueue makes stays hidden before it is delivered again
	// (when its consumer died holding it). Default goaws's 30.
	VisibilityTimeout int
}

// TB is the part of testing.TB this package uses, so that a helper
// process of a test can use it too.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// New returns clients for the emulator at TXOUTBOX_SNS_ENDPOINT.
func New(t testing.TB) *Goaws {
	t.Helper()
	endpoint := testenv.SNSEndpoint(t)
	return &Goaws{Endpoint: endpoint, SNS: NewSNSClient(t, endpoint), SQS: NewClient(endpoint)}
}

// NewClient is an SQS client on the emulator at endpoint, each call
// bounded by 30 s.
func NewClient(endpoint string) *Client {
	return &Client{Endpoint: endpoint, HTTP: &http.Client{Timeout: 30 * time.Second}}
}

// NewSNSClient is an SNS client on endpoint through the standard
// configuration, with fixed credentials (goaws checks no signature) and no
// SDK retries, so that every failure reaches the publisher.
func NewSNSClient(t TB, endpoint string) *sns.Client {
	t.Helper()
	c, err := snsbroker.NewClient(context.Background(), snsbroker.ClientOptions{
		Region:      "us-east-1",
		Endpoint:    endpoint,
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
	if err != nil {
		t.Fatal(err)
	}
	return sns.New(c.Options(), func(o *sns.Options) { o.Retryer = retry.AddWithMaxAttempts(retry.NewStandard(), 1) })
}

// SubscribeQueue makes a fresh queue subscribed to the topic (created if
// missing) and returns the topic ARN and the queue URL.
func (g *Goaws) SubscribeQueue(t TB, ctx context.Context, topic string, raw bool) (topicARN, queueURL string) {
	t.Helper()
	in := &sns.CreateTopicInput{Name: aws.String(topic)}
	if snsbroker.IsFIFO(topic) {
		in.Attributes = map[string]string{"FifoTopic": "true"}
	}
	tout, err := g.SNS.CreateTopic(ctx, in)
	if err != nil {
		t.Fatalf("CreateTopic %q: %v", topic, err)
	}
	qname := "q-" + testenv.RandomSuffix()
	if snsbroker.IsFIFO(topic) {
		qname += ".fifo"
	}
	var attrs map[string]string
	if g.VisibilityTimeout > 0 {
		attrs = map[string]string{"VisibilityTimeout": strconv.Itoa(g.VisibilityTimeout)}
	}
	queueURL, queueARN, err := g.SQS.CreateQueue(ctx, qname, attrs)
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.SNS.Subscribe(ctx, &sns.SubscribeInput{
		TopicArn: tout.TopicArn, Protocol: aws.String("sqs"), Endpoint: aws.String(queueARN),
		Attributes: map[string]string{"RawMessageDelivery": strconv.FormatBool(raw)},
	})
	if err != nil {
		t.Fatalf("Subscribe %s to %s: %v", queueARN, topic, err)
	}
	return aws.ToString(tout.TopicArn), queueURL
}

// Drain reads the queue until n messages arrived (deleting them), then
// keeps reading for settle to catch extra deliveries.
func (g *Goaws) Drain(t *testing.T, ctx context.Context, queueURL string, raw bool, topicARN string, n int, settle time.Duration) []Delivered {
	t.Helper()
	var got []Delivered
	var quietSince time.Time
	for {
		if len(got) >= n {
			if quietSince.IsZero() {
				quietSince = time.Now()
			} else if time.Since(quietSince) > settle {
				return got
			}
		}
		msgs, err := g.SQS.Receive(ctx, queueURL, ReceiveMax(queueURL))
		if err != nil {
			t.Fatalf("receive after %d of %d messages: %v", len(got), n, err)
		}
		for _, m := range msgs {
			d, err := Decode(m, raw, topicARN)
			if err != nil {
				t.Errorf("message %s: %v", m.MessageID, err)
			}
			got = append(got, d)
			quietSince = time.Time{}
			if err := g.SQS.Delete(ctx, queueURL, m.ReceiptHandle); err != nil {
				t.Fatal(err)
			}
		}
		if len(msgs) == 0 {
			select {
			case <-ctx.Done():
				t.Fatalf("received %d of %d messages: %v", len(got), n, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// Subscriber is a Watermill message.Subscriber reading an SQS queue that it
// subscribes to the topic: the consumer side of the conformance suite.
type Subscriber struct {
	T   TB // reports delivery errors
	G   *Goaws
	Raw bool // the subscription delivers raw messages (no SNS envelope)
	// QueueURL, when set, is the queue to read, already subscribed to
	// the topic (see SubscribeQueue): a consumer that restarts keeps its
	// queue and finds what it left there. Default: Subscribe makes a
	// fresh queue.
	QueueURL string

	mu     sync.Mutex
	cancel []context.CancelFunc
	wg     sync.WaitGroup
}

var _ message.Subscriber = (*Subscriber)(nil)

// Subscribe creates the topic, a queue subscribed to it (unless QueueURL
// is set), and delivers the queue's messages one at a time: the next only
// after Ack (which deletes it) or Nack (which makes it visible again).
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	var topicARN, queueURL string
	if s.QueueURL != "" {
		if !s.Raw {
			return nil, errors.New("sqstest: a Subscriber with a QueueURL reads raw deliveries only")
		}
		queueURL = s.QueueURL
	} else {
		topicARN, queueURL = s.G.SubscribeQueue(s.T, ctx, topic, s.Raw)
	}
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.cancel = append(s.cancel, cancel)
	s.mu.Unlock()
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		for ctx.Err() == nil {
			msgs, err := s.G.SQS.Receive(ctx, queueURL, ReceiveMax(queueURL))
			if err != nil {
				if ctx.Err() == nil {
					s.T.Errorf("subscriber %s: %v", topic, err)
				}
				return
			}
			if len(msgs) == 0 {
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
				continue
			}
			for _, m := range msgs {
				if !s.deliver(ctx, out, m, topicARN, queueURL) {
					return
				}
			}
		}
	}()
	return out, nil
}

func (s *Subscriber) deliver(ctx context.Context, out chan<- *message.Message, m Message, topicARN, queueURL string) bool {
	d, err := Decode(m, s.Raw, topicARN)
	if err != nil {
		s.T.Errorf("message %s: %v", m.MessageID, err)
		return s.G.SQS.Delete(ctx, queueURL, m.ReceiptHandle) == nil
	}
	msg := message.NewMessage(d.Headers[core.HeaderEventID], message.Payload(d.Payload))
	for k, v := range d.Headers {
		msg.Metadata.Set(k, v)
	}
	select {
	case out <- msg:
	case <-ctx.Done():
		return false
	}
	select {
	case <-msg.Acked():
		err = s.G.SQS.Delete(ctx, queueURL, m.ReceiptHandle)
	case <-msg.Nacked():
		err = s.G.SQS.Release(ctx, queueURL, m.ReceiptHandle)
	case <-ctx.Done():
		return false
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		s.T.Errorf("settle message %s: %v", m.MessageID, err)
	}
	return err == nil
}

// Close ends every subscription and waits for their goroutines.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	for _, c := range s.cancel {
		c()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}
