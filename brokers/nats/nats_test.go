package natsbroker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/txoutbox/brokers/cloudevent"
	natsbroker "github.com/txoutbox/txoutbox/brokers/nats"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/cetest"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

var quiet = slog.New(slog.DiscardHandler)

// space is a stream of one test on a server: its own name and subjects
// (prefix.>), so that tests in parallel never see each other's messages.
type space struct {
	url    string
	stream string
	prefix string
}

func newSpace(url string) space {
	sfx := testenv.RandomSuffix()
	return space{url: url, stream: "T" + sfx, prefix: "t" + sfx}
}

func (s space) subject(eventType string) string { return s.prefix + "." + eventType }

func (s space) publisher(t *testing.T, opts natsbroker.Options) *natsbroker.Publisher {
	t.Helper()
	opts.URL, opts.Stream, opts.Logger = s.url, s.stream, quiet
	opts.StreamSubjects = []string{s.prefix + ".>"}
	if opts.Subject == nil {
		opts.Subject = func(ev *core.Event) string { return s.subject(ev.EventType) }
	}
	p, err := natsbroker.NewPublisher(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func (s space) subscriber(t *testing.T, consumer string) *natsbroker.Subscriber {
	t.Helper()
	sub, err := natsbroker.NewSubscriber(natsbroker.SubscriberOptions{URL: s.url, Stream: s.stream, Consumer: consumer, AckWait: 5 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return sub
}

// fixture is the conformance suite's broker on a server; stop and start
// are set for a private server.
func fixture(t *testing.T, url string, srv *testenv.NATS) *outboxtest.BrokerFixture {
	s := newSpace(url)
	b := &outboxtest.BrokerFixture{
		Publisher:  s.publisher(t, natsbroker.Options{AckTimeout: 2 * time.Second}),
		Subscriber: s.subscriber(t, "suite"),
		Topic:      s.subject,
		Poison:     tooLarge,
	}
	if srv != nil {
		b.Stop = func(t *testing.T) { srv.Stop(t) }
		b.Start = func(t *testing.T) { srv.Start(t) }
	}
	return b
}

func newBroker(t *testing.T) *outboxtest.BrokerFixture {
	return fixture(t, testenv.NATSURL(t), nil)
}

// tooLarge is the event NATS cannot carry: a payload over the server's
// max_payload (1 MiB by default).
func tooLarge(ev core.Event) core.Event {
	ev.Payload = json.RawMessage(`"` + strings.Repeat("x", 2<<20) + `"`)
	return ev
}

func TestConformance(t *testing.T) {
	t.Parallel()
	outboxtest.RunPublisher(t, newBroker)
}

// The real relay from PostgreSQL through JetStream to a subscriber, and
// from MariaDB.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		outboxtest.RunEndToEnd(t, func(t *testing.T) *outboxtest.StoreFixture {
			return fixtures.SQLXPostgres(t, fixtures.Options{Logger: quiet})
		}, newBroker)
	})
	t.Run("MariaDB", func(t *testing.T) {
		t.Parallel()
		outboxtest.RunEndToEnd(t, func(t *testing.T) *outboxtest.StoreFixture {
			return fixtures.SQLXMySQL(t, fixtures.Options{Logger: quiet})
		}, newBroker)
	})
}

// A faulty, duplicating relay through JetStream into two consumers of one
// group with the inbox: every committed event takes effect once.
func TestExactlyOnce(t *testing.T) {
	t.Parallel()
	outboxtest.RunExactlyOnce(t, func(t *testing.T) *outboxtest.StoreFixture {
		return fixtures.SQLXPostgres(t, fixtures.Options{Logger: quiet, SkipInbox: true})
	}, newBroker, func(t *testing.T) *outboxtest.InboxFixture { return fixtures.PGXInbox(t) })
}

// Events enqueued while nats-server is down stay in the outbox and all
// arrive once it is back, on the storage it kept. The server is the test's
// own, so the test runs beside the others (not in make test's *Outage*
// phase, which is for the shared brokers).
func TestServerDownEndToEnd(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	outboxtest.RunOutage(t, func(t *testing.T) *outboxtest.StoreFixture {
		return fixtures.SQLXPostgres(t, fixtures.Options{Logger: quiet})
	}, func(t *testing.T) *outboxtest.BrokerFixture { return fixture(t, srv.URL(), srv) })
}

// A relay that publishes a batch again (it died before recording it) sends
// JetStream copies that it drops within the duplicate window: the stream
// holds each event once. Without Nats-Msg-Id it holds both copies.
func TestMsgIDDropsRepublishedCopies(t *testing.T) {
	t.Parallel()
	for _, noID := range []bool{false, true} {
		s := newSpace(testenv.NATSURL(t))
		p := s.publisher(t, natsbroker.Options{NoMsgID: noID})
		evs := events(t, s, 50, 5)
		for range 2 {
			if err := p.Publish(t.Context(), evs); err != nil {
				t.Fatal(err)
			}
		}
		want := uint64(len(evs))
		if noID {
			want *= 2
		}
		got := streamMessages(t, s)
		if got != want {
			t.Errorf("NoMsgID=%v: stream holds %d messages after publishing %d events twice, want %d", noID, got, len(evs), want)
		}
		t.Logf("NoMsgID=%v: %d events published twice, %d copies reach consumers", noID, len(evs), got-uint64(len(evs)))
	}
}

// The events of one aggregate are stored in batch order, and when one of
// them fails the later ones are held back, not sent ahead of its retry.
func TestHoldsAnAggregateBehindItsFailure(t *testing.T) {
	t.Parallel()
	s := newSpace(testenv.NATSURL(t))
	p := s.publisher(t, natsbroker.Options{})
	evs := events(t, s, 12, 3)
	evs[4] = tooLarge(evs[4]) // aggregate evs[4].AggregateID
	errs := core.EventErrors(p.Publish(t.Context(), evs), len(evs))
	for i, err := range errs {
		switch {
		case i == 4:
			if !core.IsPermanent(err) || !errors.Is(err, nats.ErrMaxPayload) {
				t.Errorf("the oversized event: %v, want permanent, wrapping nats.ErrMaxPayload", err)
			}
		case i > 4 && evs[i].AggregateID == evs[4].AggregateID:
			if !errors.Is(err, natsbroker.ErrEarlierFailed) || core.IsPermanent(err) {
				t.Errorf("event %d, behind the failed one of its aggregate: %v, want ErrEarlierFailed, not permanent", i, err)
			}
		case err != nil:
			t.Errorf("event %d of another aggregate, or before the failure: %v", i, err)
		}
	}
}

// Publishing to a subject no stream captures fails clearly and not
// permanently (the stream may be created), and names the stream expected.
func TestNoStreamCapturesTheSubject(t *testing.T) {
	t.Parallel()
	s := newSpace(testenv.NATSURL(t))
	p := s.publisher(t, natsbroker.Options{Subject: func(ev *core.Event) string { return "nowhere." + s.prefix }, AckTimeout: 2 * time.Second})
	evs := events(t, s, 1, 1)
	err := p.Publish(t.Context(), evs)
	if err == nil || core.IsPermanent(err) || !errors.Is(err, natsbroker.ErrPublish) || !strings.Contains(err.Error(), s.stream) {
		t.Fatalf("Publish to an uncaptured subject = %v, want a transient ErrPublish naming stream %s", err, s.stream)
	}
}

// Bad options fail before anything connects, with core.ErrInvalidOptions.
func TestInvalidOptions(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string]natsbroker.Options{
		"no stream":      {URL: "nats://127.0.0.1:1"},
		"bad subjects":   {URL: "nats://127.0.0.1:1", Stream: "S", StreamSubjects: []string{"a..b"}},
		"no URL":         {Stream: "S"},
		"not a NATS URL": {URL: "amqp://127.0.0.1:1", Stream: "S"},
		"negative ack":   {URL: "nats://127.0.0.1:1", Stream: "S", AckTimeout: -1},
	} {
		if _, err := natsbroker.NewPublisher(t.Context(), opts); !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("%s: %v, want core.ErrInvalidOptions", name, err)
		}
	}
	if _, err := natsbroker.NewPublisher(t.Context(), natsbroker.Options{URL: "nats://user:s3cret@127.0.0.1:1", Stream: "S"}); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("connect error %v: want an error without the password", err)
	}
}

func events(t *testing.T, s space, n, aggregates int) []core.Event {
	t.Helper()
	evs := make([]core.Event, n)
	for i := range evs {
		ev, err := core.NewEvent("order", string(rune('a'+i%aggregates)), "order.created", map[string]int{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		evs[i] = ev
	}
	return evs
}

func streamMessages(t *testing.T, s space) uint64 {
	t.Helper()
	nc, err := nats.Connect(s.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, s.stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// Unordered gives up the per-aggregate hold, and says so.
func TestUnordered(t *testing.T) {
	t.Parallel()
	s := newSpace(testenv.NATSURL(t))
	p := s.publisher(t, natsbroker.Options{Unordered: true})
	if p.Capabilities().PreservesAggregateOrder {
		t.Error("an Unordered publisher reports aggregate order")
	}
	evs := events(t, s, 12, 3)
	evs[4] = tooLarge(evs[4])
	errs := core.EventErrors(p.Publish(t.Context(), evs), len(evs))
	for i, err := range errs {
		if (i == 4) != (err != nil) {
			t.Errorf("event %d: %v; want only the oversized event to fail", i, err)
		}
	}
	if got := streamMessages(t, s); got != uint64(len(evs)-1) {
		t.Errorf("stream holds %d messages, want %d", got, len(evs)-1)
	}
}

// With CloudEvents on, what JetStream stored is each event as a CloudEvent
// (NATS binding), in both content modes, as the SDK decodes it from the
// raw message.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	for _, mode := range cetest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			s := newSpace(testenv.NATSURL(t))
			p := s.publisher(t, natsbroker.Options{CloudEvents: &cloudevent.Options{Source: cetest.Source, Mode: mode}})
			evs := events(t, s, 3, 3)
			for i := range evs {
				evs[i].CreatedAt = time.Now().UTC().Truncate(time.Microsecond)
			}
			if err := p.Publish(t.Context(), evs); err != nil {
				t.Fatal(err)
			}
			nc, err := nats.Connect(s.url)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			st, err := js.Stream(t.Context(), s.stream)
			if err != nil {
				t.Fatal(err)
			}
			for i, ev := range evs {
				raw, err := st.GetMsg(t.Context(), uint64(i+1))
				if err != nil {
					t.Fatal(err)
				}
				h := map[string]string{}
				for k, v := range raw.Header {
					h[k] = v[0]
				}
				cetest.Check(t, cloudevent.NATS, ev, h, raw.Data, "")
			}
		})
	}
}

// The real relay, from a PostgreSQL outbox, where a tenth of the events'
// acknowledgements are lost after JetStream stored them (outboxtest.Faulty's
// FailAfterSendRate: what a relay that dies between the broker's
// acknowledgement and its own bookkeeping leaves behind), so the relay
// publishes those events again. With Nats-Msg-Id the stream, and so every
// consumer, holds each event once; without it, each republished copy.
func TestRelayRepublishesReachNoConsumer(t *testing.T) {
	t.Parallel()
	const n = 300
	copies := map[bool]uint64{}
	for _, noID := range []bool{false, true} {
		s := newSpace(testenv.NATSURL(t))
		f := fixtures.SQLXPostgres(t, fixtures.Options{Logger: quiet, SkipInbox: true})
		faulty := &outboxtest.Faulty{Inner: s.publisher(t, natsbroker.Options{NoMsgID: noID}), FailAfterSendRate: 0.1}
		relay, err := core.NewRelay(f.Store, faulty, core.RelayOptions{PollInterval: 20 * time.Millisecond, Logger: quiet,
			Retry: core.RetryPolicy{InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxAttempts: 100}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- relay.Run(ctx) }()
		evs := events(t, s, n, 30)
		for i := 0; i < n; i += 50 {
			if err := f.Enqueue(t.Context(), evs[i:i+50], true); err != nil {
				t.Fatal(err)
			}
		}
		wait.For(t, "no event pending", func() (bool, any) {
			st, err := f.Store.(core.StatsReader).Stats(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			return st.Pending == 0, fmt.Sprintf("%d pending", st.Pending)
		})
		cancel()
		<-done
		lost := faulty.Counts().FailedAfterSend
		if lost == 0 {
			t.Fatal("no acknowledgement was lost: the test proves nothing")
		}
		copies[noID] = streamMessages(t, s) - n
		t.Logf("NoMsgID=%v: %d events, %d acknowledgements lost and sent again, %d copies reach consumers", noID, n, lost, copies[noID])
	}
	if copies[false] != 0 {
		t.Errorf("with Nats-Msg-Id, %d republished copies reached the stream, want 0", copies[false])
	}
	if copies[true] == 0 {
		t.Error("without Nats-Msg-Id no copy reached the stream: the comparison proves nothing")
	}
}
