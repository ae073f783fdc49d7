package kafkabroker_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/txoutbox/txoutbox/brokers/cloudevent"
	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/cetest"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// quiet keeps watermill's logs out of test output; set TXOUTBOX_TEST_LOG=1
// to see them.
var quiet = fixtures.Quiet()

// cluster is an in-process Kafka-protocol cluster (kfake) that the real
// franz-go client talks to over TCP. With a data directory it can be stopped
// and started again on the same ports with its topics, offsets and
// producer state, as a broker restart.
type cluster struct {
	c     *kfake.Cluster
	addrs []string
	opts  []kfake.Opt
}

func newCluster(t testing.TB, extra ...kfake.Opt) *cluster {
	t.Helper()
	opts := append([]kfake.Opt{
		kfake.NumBrokers(3),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(4),
		// Consumer groups in tests join quickly.
		kfake.GroupMinSessionTimeout(time.Second),
	}, extra...)
	// Ports below the ephemeral range (testenv.FreePort): a test that
	// stops the cluster starts it again on the same ports, which an
	// outgoing connection could take meanwhile.
	var c *kfake.Cluster
	var err error
	for range 3 { // a port free when picked may be bound before kfake binds it
		ports := []int{testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t)}
		if c, err = kfake.NewCluster(append(opts, kfake.Ports(ports...))...); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	cl := &cluster{c: c, addrs: c.ListenAddrs(), opts: opts}
	t.Cleanup(func() { cl.c.Close() })
	return cl
}

// stop closes every broker's listener and connection.
func (cl *cluster) stop() { cl.c.Close() }

// start brings the cluster back on the ports it had.
func (cl *cluster) start(t testing.TB) {
	t.Helper()
	var ports []int
	for _, a := range cl.addrs {
		_, p, err := net.SplitHostPort(a)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(p)
		ports = append(ports, n)
	}
	wait.For(t, "kfake to start again on "+strings.Join(cl.addrs, ","), func() (bool, any) {
		c, err := kfake.NewCluster(append(cl.opts, kfake.Ports(ports...))...)
		if err != nil {
			return false, err.Error()
		}
		cl.c = c
		return true, nil
	})
}

func newPublisher(t testing.TB, brokers []string, opts kafkabroker.Options) *kafkabroker.Publisher {
	t.Helper()
	opts.Brokers = brokers
	p, err := kafkabroker.NewPublisher(opts)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func newSubscriber(t testing.TB, brokers []string, group string, extra ...kgo.Opt) message.Subscriber {
	t.Helper()
	if group == "" {
		group = "g-" + testenv.RandomSuffix()
	}
	s, err := kafkabroker.NewSubscriber(kafkabroker.SubscriberOptions{
		Brokers: brokers, ConsumerGroup: group, Client: append(fixtures.KafkaGroupTimings(), extra...), Logger: quiet,
	})
	if err != nil {
		t.Fatalf("NewSubscriber: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	cl := newCluster(t)
	outboxtest.RunPublisher(t, func(t *testing.T) *outboxtest.BrokerFixture {
		return &outboxtest.BrokerFixture{
			Publisher:  newPublisher(t, cl.addrs, kafkabroker.Options{}),
			Subscriber: newSubscriber(t, cl.addrs, ""),
			Poison:     tooLarge,
		}
	})
}

// tooLarge is the event Kafka cannot carry with the default
// MaxRecordBytes (1 MiB): an outbox whose core.Limits allow larger
// payloads can hold one. (A long header key is no poison here: Kafka
// carries it.)
func tooLarge(ev core.Event) core.Event {
	ev.Payload = json.RawMessage(`"` + strings.Repeat("x", 1<<20) + `"`)
	return ev
}

func event(t testing.TB, eventType, agg string, n int) core.Event {
	t.Helper()
	ev, err := core.NewEvent("order", agg, eventType, map[string]int{"n": n})
	if err != nil {
		t.Fatal(err)
	}
	ev.ID = uuid.Must(uuid.NewV7()).String()
	ev.Headers = map[string]string{"tenant": "acme"}
	return ev
}

// consumeAll reads every record of topic's partitions with a plain
// franz-go consumer (read_uncommitted) until n arrived.
func consumeAll(t testing.TB, brokers []string, topic string, n int) []*kgo.Record {
	t.Helper()
	c, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var got []*kgo.Record
	wait.For(t, fmt.Sprintf("%d records of %s", n, topic), func() (bool, any) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		got = append(got, c.PollFetches(ctx).Records()...)
		return len(got) >= n, len(got)
	})
	return got
}

// headers returns a record's headers as a map.
func headers(r *kgo.Record) map[string]string {
	h := map[string]string{}
	for _, rh := range r.Headers {
		h[rh.Key] = string(rh.Value)
	}
	return h
}

// Records are keyed by aggregate ID (one aggregate, one partition, in
// order) and carry the event's headers as Kafka record headers.
func TestRecordKeyPartitionAndHeaders(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	p := newPublisher(t, cl.addrs, kafkabroker.Options{})
	et := "order.created"
	var evs []core.Event
	for i := range 30 {
		evs = append(evs, event(t, et, fmt.Sprint("o-", i%5), i))
	}
	if err := p.Publish(t.Context(), evs); err != nil {
		t.Fatal(err)
	}
	byID := map[string]core.Event{}
	for _, ev := range evs {
		byID[ev.ID] = ev
	}
	recs := consumeAll(t, cl.addrs, et, len(evs))
	partOf := map[string]int32{}
	lastN := map[string]int{}
	parts := map[int32]bool{}
	for _, r := range recs {
		h := headers(r)
		ev, ok := byID[h[core.HeaderEventID]]
		if !ok {
			t.Fatalf("record without a known event_id: %v", h)
		}
		for k, v := range ev.MessageHeaders() {
			if h[k] != v {
				t.Errorf("record header %q = %q, want %q", k, h[k], v)
			}
		}
		if string(r.Key) != ev.AggregateID {
			t.Errorf("key = %q, want aggregate id %q", r.Key, ev.AggregateID)
		}
		if p, seen := partOf[ev.AggregateID]; seen && p != r.Partition {
			t.Errorf("aggregate %s on partitions %d and %d", ev.AggregateID, p, r.Partition)
		}
		partOf[ev.AggregateID] = r.Partition
		parts[r.Partition] = true
		var n int
		fmt.Sscanf(string(ev.Payload), `{"n":%d}`, &n)
		if last, seen := lastN[ev.AggregateID]; seen && n < last {
			t.Errorf("aggregate %s: #%d after #%d", ev.AggregateID, n, last)
		}
		lastN[ev.AggregateID] = n
	}
	if len(parts) < 2 {
		t.Errorf("5 aggregates all on one partition: keys do not spread")
	}
}

// The producer asks for acks=all and is idempotent: the cluster sees an
// InitProducerID request, and every produce request has acks -1 and record
// batches stamped with the producer ID and sequence numbers.
func TestAcksAllAndIdempotentProducer(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	var initPID, produces, bad atomic.Int64
	var mu sync.Mutex
	var problems []string
	cl.c.ControlKey(int16(kmsg.InitProducerID), func(kmsg.Request) (kmsg.Response, error, bool) {
		cl.c.KeepControl()
		initPID.Add(1)
		return nil, nil, false
	})
	cl.c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cl.c.KeepControl()
		pr := req.(*kmsg.ProduceRequest)
		produces.Add(1)
		if pr.Acks != -1 {
			bad.Add(1)
			mu.Lock()
			problems = append(problems, fmt.Sprintf("acks = %d", pr.Acks))
			mu.Unlock()
		}
		for _, tp := range pr.Topics {
			for _, pp := range tp.Partitions {
				// RecordBatch v2: producerId is the int64 at byte 43.
				if len(pp.Records) < 61 {
					continue
				}
				if pid := int64(binary.BigEndian.Uint64(pp.Records[43:51])); pid < 0 {
					bad.Add(1)
					mu.Lock()
					problems = append(problems, fmt.Sprintf("batch without producer id (%d)", pid))
					mu.Unlock()
				}
			}
		}
		return nil, nil, false
	})
	p := newPublisher(t, cl.addrs, kafkabroker.Options{})
	var evs []core.Event
	for i := range 20 {
		evs = append(evs, event(t, "order.idem", fmt.Sprint("o-", i%4), i))
	}
	if err := p.Publish(t.Context(), evs); err != nil {
		t.Fatal(err)
	}
	if initPID.Load() == 0 {
		t.Error("no InitProducerID request: the producer is not idempotent")
	}
	if produces.Load() == 0 {
		t.Fatal("no produce request seen")
	}
	if bad.Load() > 0 {
		t.Errorf("%d bad produce requests: %v", bad.Load(), problems)
	}
}

// Options.Client cannot weaken what an outbox needs: acks from every
// in-sync replica win over kgo.RequiredAcks(kgo.LeaderAck()) (the cluster
// sees acks -1), and turning idempotence off is refused.
func TestClientOptionsAreMadeSafe(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	var acks []int16
	var mu sync.Mutex
	cl.c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cl.c.KeepControl()
		mu.Lock()
		acks = append(acks, req.(*kmsg.ProduceRequest).Acks)
		mu.Unlock()
		return nil, nil, false
	})
	p := newPublisher(t, cl.addrs, kafkabroker.Options{Client: []kgo.Opt{kgo.RequiredAcks(kgo.LeaderAck())}})
	if err := p.Publish(t.Context(), []core.Event{event(t, "order.safe", "o-1", 0)}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(acks) == 0 {
		t.Fatal("no produce request seen")
	}
	for _, a := range acks {
		if a != -1 {
			t.Errorf("produce request with acks %d, want -1 (all in-sync replicas)", a)
		}
	}
	_, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: cl.addrs, Client: []kgo.Opt{kgo.DisableIdempotentWrite()}})
	if !errors.Is(err, core.ErrInvalidOptions) || !strings.Contains(err.Error(), "DisableIdempotentWrite") {
		t.Errorf("NewPublisher with kgo.DisableIdempotentWrite = %v, want core.ErrInvalidOptions naming it", err)
	}
}

func TestTopicMap(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	p := newPublisher(t, cl.addrs, kafkabroker.Options{Topic: kafkabroker.TopicMap(map[string]string{"order.created": "orders"})})
	evs := []core.Event{event(t, "order.created", "o-1", 0), event(t, "order.paid", "o-1", 1)}
	if err := p.Publish(t.Context(), evs); err != nil {
		t.Fatal(err)
	}
	if r := consumeAll(t, cl.addrs, "orders", 1); string(r[0].Key) != "o-1" {
		t.Errorf("orders: key %q", r[0].Key)
	}
	consumeAll(t, cl.addrs, "order.paid", 1)
}

// Two subscribers in one consumer group share the partitions: once the
// group has settled both receive events, and between them every event
// arrives.
func TestConsumerGroupSharesPartitions(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	p := newPublisher(t, cl.addrs, kafkabroker.Options{})
	et := "order.grouped"
	group := "g-" + testenv.RandomSuffix()
	a := fixtures.Receive(t, newSubscriber(t, cl.addrs, group), et)
	b := fixtures.Receive(t, newSubscriber(t, cl.addrs, group), et)
	var sent []core.Event
	// Keep publishing (40 aggregates over 4 partitions per round) until the
	// second member has joined and both got a share.
	round := 0
	wait.Until(t, "both members of the group to get a share", func() bool {
		if a.Count() > 0 && b.Count() > 0 {
			return true
		}
		var evs []core.Event
		for i := range 40 {
			evs = append(evs, event(t, et, fmt.Sprint("o-", i), round))
		}
		if err := p.Publish(t.Context(), evs); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, evs...)
		round++
		time.Sleep(300 * time.Millisecond)
		return false
	})
	wait.For(t, "every event at the group", func() (bool, any) {
		got := a.IDs()
		for id, n := range b.IDs() {
			got[id] += n
		}
		missing := 0
		for _, ev := range sent {
			if got[ev.ID] == 0 {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d missing", missing, len(sent))
	})
	t.Logf("%d events: the members received %d and %d", len(sent), a.Count(), b.Count())
}

func TestInvalidOptions(t *testing.T) {
	if _, err := kafkabroker.NewPublisher(kafkabroker.Options{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("no brokers: %v", err)
	}
	if _, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: []string{"x:1"}, MaxRecordBytes: -1}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("negative MaxRecordBytes: %v", err)
	}
	if _, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: []string{"x:1"}, Transactional: &kafkabroker.Transactional{}}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("Transactional without an ID: %v", err)
	}
	if _, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: []string{"x:1"}, Transactional: &kafkabroker.Transactional{ID: "a", PositionTopic: "no spaces"}}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("Transactional with a bad position topic: %v", err)
	}
	if _, err := kafkabroker.NewSubscriber(kafkabroker.SubscriberOptions{Brokers: []string{"x:1"}}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("no group: %v", err)
	}
}

// With CloudEvents on, each record is the event as a CloudEvent (Kafka
// binding: "ce_" headers and content-type), in both content modes, as the
// SDK decodes it from the raw record.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for _, mode := range cetest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			cl := newCluster(t)
			p := newPublisher(t, cl.addrs, kafkabroker.Options{CloudEvents: &cloudevent.Options{Source: cetest.Source, Mode: mode}})
			et := "order.created"
			byID := map[string]core.Event{}
			var evs []core.Event
			for i := range 3 {
				ev := event(t, et, fmt.Sprint("o-", i), i)
				ev.CreatedAt = time.Now().UTC().Truncate(time.Microsecond)
				evs = append(evs, ev)
				byID[ev.ID] = ev
			}
			if err := p.Publish(t.Context(), evs); err != nil {
				t.Fatal(err)
			}
			for _, r := range consumeAll(t, cl.addrs, et, len(evs)) {
				h := headers(r)
				ev, ok := byID[h[core.HeaderEventID]]
				if !ok {
					t.Fatalf("a record of no event: %v", h)
				}
				cetest.Check(t, cloudevent.Kafka, ev, h, r.Value, "")
			}
		})
	}
}
