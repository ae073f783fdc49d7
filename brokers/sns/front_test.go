package snsbroker_test

// goaws v0.4.5 has no PublishBatch (its router answers 400 "Bad Request" to
// the action) and ignores MessageGroupId and MessageDeduplicationId. front is
// a real HTTP server in front of goaws that speaks the SNS query protocol: it
// implements PublishBatch by validating the batch as SNS does and handing
// every entry to goaws as a Publish, records what it was sent (FIFO fields
// included), can refuse chosen entries or whole calls, and passes every other
// action through to goaws. So the real SDK client serialises PublishBatch and
// parses the answer, and the accepted entries really reach the SQS queues.

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sns"

	snsbroker "github.com/txoutbox/txoutbox/brokers/sns"
	"github.com/txoutbox/txoutbox/internal/testkit/sqstest"
)

// newSNSClient is an SNS client on endpoint with no SDK retries, so that
// every failure reaches the publisher.
func newSNSClient(t *testing.T, endpoint string) *sns.Client {
	return sqstest.NewSNSClient(t, endpoint)
}

// sentEntry is one message front received, by Publish or PublishBatch.
type sentEntry struct {
	Action     string
	TopicARN   string
	ID         string // batch entry ID
	Message    string
	GroupID    string
	DedupID    string
	Attributes map[string]string
}

// front is the SNS query-protocol server described above.
type front struct {
	t      *testing.T
	goaws  string
	server *httptest.Server
	proxy  *httputil.ReverseProxy

	down atomic.Bool // while set, connections are cut without an answer

	mu       sync.Mutex
	actions  map[string]int // calls per Action
	batches  [][]sentEntry  // PublishBatch calls, as received
	singles  []sentEntry    // Publish calls
	failWith func(e sentEntry) (code string, senderFault bool, fail bool)
	drop     func(e sentEntry) bool // answer neither Successful nor Failed
	failCall func(entries []sentEntry) (status int, code string, fail bool)
	delay    time.Duration // before answering a PublishBatch

	inFlight, maxInFlight int // PublishBatch calls being answered
}

func (f *front) MaxInFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.maxInFlight
}

func newFront(t *testing.T, goawsEndpoint string) *front {
	t.Helper()
	u, err := url.Parse(goawsEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	f := &front{t: t, goaws: goawsEndpoint, proxy: httputil.NewSingleHostReverseProxy(u)}
	f.server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.server.Close)
	return f
}

func (f *front) URL() string { return f.server.URL }

func (f *front) Batches() [][]sentEntry {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]sentEntry(nil), f.batches...)
}

func (f *front) Singles() []sentEntry {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sentEntry(nil), f.singles...)
}

func (f *front) Calls(action string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.actions[action]
}

func (f *front) set(fn func(f *front)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *front) serve(w http.ResponseWriter, r *http.Request) {
	if f.down.Load() {
		// An outage as the client sees one: the connection drops.
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	if f.actions == nil {
		f.actions = map[string]int{}
	}
	f.actions[form.Get("Action")]++
	f.mu.Unlock()
	switch form.Get("Action") {
	case "PublishBatch":
		f.publishBatch(w, r.Context(), form)
		return
	case "Publish":
		e := sentEntry{Action: "Publish", TopicARN: form.Get("TopicArn"), Message: form.Get("Message"),
			GroupID: form.Get("MessageGroupId"), DedupID: form.Get("MessageDeduplicationId"), Attributes: attributesOf(form, "")}
		if msg := fifoProblem(e); msg != "" {
			writeError(w, http.StatusBadRequest, "InvalidParameter", msg)
			return
		}
		f.mu.Lock()
		f.singles = append(f.singles, e)
		f.mu.Unlock()
	}
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	r.ContentLength = int64(len(body))
	f.proxy.ServeHTTP(w, r)
}

// attributesOf reads MessageAttributes.entry.N.* under prefix.
func attributesOf(form url.Values, prefix string) map[string]string {
	attrs := map[string]string{}
	for i := 1; ; i++ {
		p := fmt.Sprintf("%sMessageAttributes.entry.%d.", prefix, i)
		name := form.Get(p + "Name")
		if name == "" {
			return attrs
		}
		attrs[name] = form.Get(p + "Value.StringValue")
	}
}

// fifoProblem applies SNS's FIFO rules to one entry.
func fifoProblem(e sentEntry) string {
	if !snsbroker.IsFIFO(e.TopicARN) {
		return ""
	}
	if e.GroupID == "" {
		return "The MessageGroupId parameter is required for FIFO topics"
	}
	if e.DedupID == "" {
		return "The topic should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly"
	}
	return ""
}

type batchSuccess struct {
	ID        string `xml:"Id"`
	MessageID string `xml:"MessageId"`
}

type batchFailure struct {
	ID          string `xml:"Id"`
	Code        string `xml:"Code"`
	Message     string `xml:"Message"`
	SenderFault bool   `xml:"SenderFault"`
}

func (f *front) publishBatch(w http.ResponseWriter, ctx context.Context, form url.Values) {
	arn := form.Get("TopicArn")
	var entries []sentEntry
	for i := 1; ; i++ {
		p := fmt.Sprintf("PublishBatchRequestEntries.member.%d.", i)
		id := form.Get(p + "Id")
		if id == "" {
			break
		}
		entries = append(entries, sentEntry{Action: "PublishBatch", TopicARN: arn, ID: id, Message: form.Get(p + "Message"),
			GroupID: form.Get(p + "MessageGroupId"), DedupID: form.Get(p + "MessageDeduplicationId"), Attributes: attributesOf(form, p)})
	}
	f.mu.Lock()
	f.batches = append(f.batches, entries)
	failWith, drop, failCall, delay := f.failWith, f.drop, f.failCall, f.delay
	f.inFlight++
	f.maxInFlight = max(f.maxInFlight, f.inFlight)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inFlight--
		f.mu.Unlock()
	}()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
	}

	// Whole-call errors, as SNS checks them.
	switch {
	case len(entries) == 0:
		writeError(w, http.StatusBadRequest, "EmptyBatchRequest", "The batch request doesn't contain any entries")
		return
	case len(entries) > snsbroker.MaxBatchEntries:
		writeError(w, http.StatusBadRequest, "TooManyEntriesInBatchRequest", "The batch request contains more entries than permissible")
		return
	}
	size := 0
	seen := map[string]bool{}
	for _, e := range entries {
		if seen[e.ID] {
			writeError(w, http.StatusBadRequest, "BatchEntryIdsNotDistinct", "Two or more batch entries in the request have the same Id")
			return
		}
		seen[e.ID] = true
		size += len(e.Message)
		for k, v := range e.Attributes {
			size += len(k) + len("String") + len(v)
		}
	}
	if size > snsbroker.MaxMessageBytes {
		writeError(w, http.StatusBadRequest, "BatchRequestTooLong", "The length of all the messages put together is more than the limit")
		return
	}
	if failCall != nil {
		if status, code, fail := failCall(entries); fail {
			writeError(w, status, code, "refused by the test")
			return
		}
	}

	var res struct {
		XMLName    xml.Name       `xml:"PublishBatchResponse"`
		Xmlns      string         `xml:"xmlns,attr"`
		Successful []batchSuccess `xml:"PublishBatchResult>Successful>member"`
		Failed     []batchFailure `xml:"PublishBatchResult>Failed>member"`
		RequestID  string         `xml:"ResponseMetadata>RequestId"`
	}
	res.Xmlns = "http://sns.amazonaws.com/doc/2010-03-31/"
	res.RequestID = "front"
	for _, e := range entries {
		if msg := fifoProblem(e); msg != "" {
			res.Failed = append(res.Failed, batchFailure{ID: e.ID, Code: "InvalidParameter", Message: msg, SenderFault: true})
			continue
		}
		if len(e.Attributes) > snsbroker.MaxAttributes {
			res.Failed = append(res.Failed, batchFailure{ID: e.ID, Code: "InvalidParameter", Message: "too many message attributes", SenderFault: true})
			continue
		}
		if failWith != nil {
			if code, sender, fail := failWith(e); fail {
				res.Failed = append(res.Failed, batchFailure{ID: e.ID, Code: code, Message: "refused by the test", SenderFault: sender})
				continue
			}
		}
		msgID, err := f.forward(ctx, e)
		if err != nil {
			res.Failed = append(res.Failed, batchFailure{ID: e.ID, Code: "InternalError", Message: err.Error()})
			continue
		}
		if drop != nil && drop(e) {
			continue
		}
		res.Successful = append(res.Successful, batchSuccess{ID: e.ID, MessageID: msgID})
	}
	w.Header().Set("Content-Type", "text/xml")
	if err := xml.NewEncoder(w).Encode(res); err != nil {
		f.t.Errorf("front: encode PublishBatch answer: %v", err)
	}
}

// forward publishes one entry to goaws with a Publish call.
func (f *front) forward(ctx context.Context, e sentEntry) (string, error) {
	form := url.Values{"Action": {"Publish"}, "Version": {"2010-03-31"}, "TopicArn": {e.TopicARN}, "Message": {e.Message}}
	i := 1
	for k, v := range e.Attributes {
		p := "MessageAttributes.entry." + strconv.Itoa(i) + "."
		form.Set(p+"Name", k)
		form.Set(p+"Value.DataType", "String")
		form.Set(p+"Value.StringValue", v)
		i++
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.goaws, strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("goaws Publish: %s: %s", resp.Status, b)
	}
	var out struct {
		MessageID string `xml:"PublishResult>MessageId"`
	}
	if err := xml.Unmarshal(b, &out); err != nil {
		return "", fmt.Errorf("goaws Publish: decode %q: %w", b, err)
	}
	return out.MessageID, nil
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<ErrorResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><Error><Type>Sender</Type><Code>%s</Code><Message>%s</Message></Error><RequestId>front</RequestId></ErrorResponse>`, code, msg)
}

// compile-time check that the SDK client is what the publisher takes.
var _ snsbroker.API = (*sns.Client)(nil)
