package kafkabroker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

func txPublisher(t *testing.T, addrs []string, id string) *kafkabroker.Publisher {
	t.Helper()
	return newPublisher(t, addrs, kafkabroker.Options{Transactional: &kafkabroker.Transactional{ID: id, Timeout: 10 * time.Second}})
}

// readCommitted returns the event IDs of topic's committed records, once
// no more come.
func readCommitted(t *testing.T, addrs []string, topic string, want int) map[string]int {
	t.Helper()
	c, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ids := map[string]int{}
	n := 0
	wait.For(t, fmt.Sprintf("%d committed records of %s", want, topic), func() (bool, any) {
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		for _, r := range c.PollFetches(ctx).Records() {
			ids[headers(r)[core.HeaderEventID]]++
			n++
		}
		return n >= want, n
	})
	// Anything more would be a record of an aborted transaction.
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	for _, r := range c.PollFetches(ctx).Records() {
		ids[headers(r)[core.HeaderEventID]]++
	}
	return ids
}

// A Publish whose context carries a position stores it with the events in
// one transaction; CommittedPosition reads it back, found behind many
// other IDs' positions. A second publisher with the same ID fences the
// first: the first's next commit fails and its events never reach a
// read_committed consumer.
func TestTransactionalPositions(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := t.Context()
	et := "order.tx"
	a := txPublisher(t, cl.addrs, "relay-a")
	if pos, err := a.CommittedPosition(ctx); err != nil || pos != 0 {
		t.Fatalf("CommittedPosition before any publish = %d, %v; want 0", pos, err)
	}
	if !a.Capabilities().StoresPositions {
		t.Error("a transactional publisher does not report StoresPositions")
	}
	first := []core.Event{event(t, et, "o-1", 0), event(t, et, "o-2", 1)}
	if err := a.Publish(core.WithPosition(ctx, 10), first); err != nil {
		t.Fatal(err)
	}
	// 600 positions of another relay after it: the read goes back past
	// its first windows.
	other := txPublisher(t, cl.addrs, "relay-other")
	if _, err := other.CommittedPosition(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 600 {
		if err := other.Publish(core.WithPosition(ctx, uint64(i+1)), []core.Event{event(t, "order.other", "x", i)}); err != nil {
			t.Fatal(err)
		}
	}

	b := txPublisher(t, cl.addrs, "relay-a")
	if pos, err := b.CommittedPosition(ctx); err != nil || pos != 10 {
		t.Fatalf("the successor's CommittedPosition = %d, %v; want 10", pos, err)
	}
	fenced := []core.Event{event(t, et, "o-1", 2)}
	err := a.Publish(core.WithPosition(ctx, 20), fenced)
	if err == nil {
		t.Fatal("the fenced publisher's Publish succeeded")
	}
	if !errors.Is(err, kafkabroker.ErrPublish) {
		t.Errorf("fenced Publish = %v, want ErrPublish", err)
	}
	second := []core.Event{event(t, et, "o-1", 3)}
	if err := b.Publish(core.WithPosition(ctx, 30), second); err != nil {
		t.Fatal(err)
	}
	if pos, err := txPublisher(t, cl.addrs, "relay-a").CommittedPosition(ctx); err != nil || pos != 30 {
		t.Fatalf("CommittedPosition after the successor's publish = %d, %v; want 30", pos, err)
	}
	if pos, err := txPublisher(t, cl.addrs, "relay-other").CommittedPosition(ctx); err != nil || pos != 600 {
		t.Fatalf("the other relay's CommittedPosition = %d, %v; want 600", pos, err)
	}
	ids := readCommitted(t, cl.addrs, et, 3)
	for _, ev := range append(first, second...) {
		if ids[ev.ID] != 1 {
			t.Errorf("event %s read %d times, want once", ev.ID, ids[ev.ID])
		}
	}
	if ids[fenced[0].ID] != 0 {
		t.Errorf("the fenced publisher's event reached a read_committed consumer")
	}

	// A Publish without a position (the table's retry path) is plain.
	plain := []core.Event{event(t, "order.plain", "o-9", 0)}
	if err := b.Publish(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if got := readCommitted(t, cl.addrs, "order.plain", 1); got[plain[0].ID] != 1 {
		t.Errorf("plain publish: %v", got)
	}
}

// An event that cannot be a record fails for good before the transaction
// begins; the others fail with a transient error, and nothing is written.
func TestTransactionalRefusesTheBatchOfABadEvent(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	p := txPublisher(t, cl.addrs, "relay-bad")
	if _, err := p.CommittedPosition(t.Context()); err != nil {
		t.Fatal(err)
	}
	evs := []core.Event{event(t, "order.big", "o-1", 0), tooLarge(event(t, "order.big", "o-1", 1)), event(t, "order.big", "o-2", 2)}
	err := p.Publish(core.WithPosition(t.Context(), 5), evs)
	var be *core.BatchError
	if !errors.As(err, &be) || len(be.Errs) != 3 {
		t.Fatalf("Publish = %v, want a BatchError of 3", err)
	}
	for i, e := range be.Errs {
		if e == nil || core.IsPermanent(e) != (i == 1) {
			t.Errorf("event %d: %v (permanent %v), want permanent only for the large one", i, e, core.IsPermanent(e))
		}
	}
	if pos, err := p.CommittedPosition(t.Context()); err != nil || pos != 0 {
		t.Errorf("CommittedPosition = %d, %v; want 0: nothing was committed", pos, err)
	}
	// Without the large event, the batch goes through.
	if err := p.Publish(core.WithPosition(t.Context(), 5), []core.Event{evs[0], evs[2]}); err != nil {
		t.Fatal(err)
	}
	if ids := readCommitted(t, cl.addrs, "order.big", 2); len(ids) != 2 {
		t.Errorf("read %v, want the two small events once each", ids)
	}
}

// A cluster that refuses the transactional ID is reported by NewPublisher
// with ErrTransactions, naming the ID.
func TestTransactionalRefusedByTheCluster(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	cl.c.ControlKey(int16(kmsg.FindCoordinator), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cl.c.KeepControl()
		r := req.(*kmsg.FindCoordinatorRequest)
		if r.CoordinatorType != 1 {
			return nil, nil, false
		}
		resp := r.ResponseKind().(*kmsg.FindCoordinatorResponse)
		resp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
		for _, k := range append(r.CoordinatorKeys, r.CoordinatorKey) {
			c := kmsg.NewFindCoordinatorResponseCoordinator()
			c.Key, c.ErrorCode = k, kerr.TransactionalIDAuthorizationFailed.Code
			resp.Coordinators = append(resp.Coordinators, c)
		}
		return resp, nil, true
	})
	_, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: cl.addrs, Transactional: &kafkabroker.Transactional{ID: "forbidden"}})
	if !errors.Is(err, kafkabroker.ErrTransactions) || !strings.Contains(err.Error(), `"forbidden"`) {
		t.Fatalf("NewPublisher = %v, want ErrTransactions naming the ID", err)
	}
}
