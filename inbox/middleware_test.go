package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/google/uuid"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

var errHandler = errors.New("handler failed")

func eventMessage(eventID string) *message.Message {
	msg := message.NewMessage(uuid.NewString(), message.Payload(`{}`))
	if eventID != "" {
		msg.Metadata.Set(core.HeaderEventID, eventID)
	}
	return msg
}

func sqliteFixture(t *testing.T) (*outboxtest.InboxFixture, *sqlinbox.Inbox, *sql.DB) {
	return fixtures.InboxBackends[1].NewSQLInbox(t, false)
}

func TestNewMiddlewareRejectsBadOptions(t *testing.T) {
	_, ib, _ := sqliteFixture(t)
	for name, tc := range map[string]struct {
		ib   core.Inbox
		opts inbox.Options
		want string
	}{
		"no consumer":    {ib, inbox.Options{}, "Consumer is empty"},
		"blank consumer": {ib, inbox.Options{Consumer: "  "}, "Consumer is empty"},
		"no inbox":       {nil, inbox.Options{Consumer: "c"}, "needs a core.Inbox"},
		"bad policy":     {ib, inbox.Options{Consumer: "c", MissingEventID: 42}, "MissingEventID"},
	} {
		mw, err := inbox.NewMiddleware(tc.ib, tc.opts)
		if !errors.Is(err, core.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.want) || mw != nil {
			t.Errorf("%s: NewMiddleware = %v, want ErrInvalidOptions naming %q", name, err, tc.want)
		}
	}
}

func TestMiddleware(t *testing.T) {
	f, ib, _ := sqliteFixture(t)
	var dups []string
	mw, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: "inventory", OnDuplicate: func(_ context.Context, consumer, eventID string) {
		dups = append(dups, consumer+"/"+eventID)
	}})
	if err != nil {
		t.Fatal(err)
	}
	var runs int
	var failNext bool
	out := message.NewMessage("out", nil)
	h := mw(func(msg *message.Message) ([]*message.Message, error) {
		runs++
		ctx := msg.Context()
		if sqlinbox.Tx(ctx) == nil {
			t.Error("handler: no transaction in msg.Context()")
		}
		if err := f.Effect(ctx, msg.Metadata.Get(core.HeaderEventID)); err != nil {
			return nil, err
		}
		if failNext {
			failNext = false
			return nil, errHandler
		}
		return []*message.Message{out}, nil
	})
	id := uuid.NewString()

	t.Run("FirstDeliveryRunsInTransaction", func(t *testing.T) {
		msg := eventMessage(id)
		orig := msg.Context()
		got, err := h(msg)
		if err != nil || len(got) != 1 || got[0] != out || runs != 1 {
			t.Fatalf("h = (%v, %v) after %d runs, want the handler's messages after 1", got, err, runs)
		}
		if msg.Context() != orig || sqlinbox.Tx(msg.Context()) != nil {
			t.Error("the message's context was not restored after the handler")
		}
		if len(dups) != 0 {
			t.Errorf("OnDuplicate called for a first delivery: %v", dups)
		}
	})
	t.Run("DuplicateIsAckedWithoutHandler", func(t *testing.T) {
		got, err := h(eventMessage(id))
		if err != nil || got != nil || runs != 1 {
			t.Fatalf("duplicate: h = (%v, %v), handler runs %d; want (nil, nil), 1", got, err, runs)
		}
		if want := []string{"inventory/" + id}; !slices.Equal(dups, want) {
			t.Errorf("OnDuplicate calls %v, want %v", dups, want)
		}
	})
	t.Run("HandlerErrorIsReturnedAndRolledBack", func(t *testing.T) {
		id2 := uuid.NewString()
		failNext = true
		if _, err := h(eventMessage(id2)); !errors.Is(err, errHandler) || !strings.Contains(err.Error(), id2) {
			t.Fatalf("h = %v, want the handler's error naming the event", err)
		}
		inboxProcessed(t, f, "inventory", id2, false)
		if _, err := h(eventMessage(id2)); err != nil {
			t.Fatalf("redelivery: %v", err)
		}
		inboxProcessed(t, f, "inventory", id2, true)
		effects, err := f.Effects(t.Context())
		if err != nil || effects[id] != 1 || effects[id2] != 1 {
			t.Fatalf("effects %v (%v), want one each", effects, err)
		}
	})
	t.Run("MissingEventIDRejected", func(t *testing.T) {
		before := runs
		_, err := h(eventMessage(""))
		if !inbox.IsMissingEventID(err) || !errors.Is(err, core.ErrMissingEventID) || runs != before {
			t.Fatalf("h(no event_id) = %v, handler ran %d times; want ErrMissingEventID, not run", err, runs-before)
		}
	})
}

func TestMissingEventIDPolicies(t *testing.T) {
	f, ib, _ := sqliteFixture(t)
	t.Run("UseMessageUUID", func(t *testing.T) {
		mw, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: "c", MissingEventID: inbox.UseMessageUUID})
		if err != nil {
			t.Fatal(err)
		}
		runs := 0
		h := mw(func(msg *message.Message) ([]*message.Message, error) {
			runs++
			return nil, f.Effect(msg.Context(), msg.UUID)
		})
		msg := eventMessage("")
		for range 3 {
			if _, err := h(msg.Copy()); err != nil {
				t.Fatal(err)
			}
		}
		if runs != 1 {
			t.Errorf("handler ran %d times for one message UUID, want 1", runs)
		}
		inboxProcessed(t, f, "c", msg.UUID, true)
	})
	t.Run("ProcessWithoutDedup", func(t *testing.T) {
		mw, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: "c", MissingEventID: inbox.ProcessWithoutDedup})
		if err != nil {
			t.Fatal(err)
		}
		runs := 0
		h := mw(func(msg *message.Message) ([]*message.Message, error) {
			runs++
			if hasID := msg.Metadata.Get(core.HeaderEventID) != ""; hasID != (sqlinbox.Tx(msg.Context()) != nil) {
				t.Errorf("message with event id %v: inbox transaction %v", hasID, !hasID)
			}
			return nil, nil
		})
		msg := eventMessage("")
		for range 2 {
			if _, err := h(msg.Copy()); err != nil {
				t.Fatal(err)
			}
		}
		if runs != 2 {
			t.Errorf("handler ran %d times, want 2 (the caller chose no deduplication)", runs)
		}
		// Messages with an event ID are still deduplicated.
		id := uuid.NewString()
		for range 2 {
			if _, err := h(eventMessage(id)); err != nil {
				t.Fatal(err)
			}
		}
		if runs != 3 {
			t.Errorf("handler ran %d times, want 3", runs)
		}
	})
}

// TestPoisonQueueTakesMissingEventID shows the intended wiring: a message
// without event_id goes to the poison topic, is acked there, and the handler
// never sees it; handler errors are still nacked for redelivery.
func TestPoisonQueueTakesMissingEventID(t *testing.T) {
	_, ib, _ := sqliteFixture(t)
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	t.Cleanup(func() { pubSub.Close() })
	poison, err := middleware.PoisonQueueWithFilter(pubSub, "poison", inbox.IsMissingEventID)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int32
	var failed atomic.Bool
	router := newRouter(t)
	router.AddMiddleware(poison, mw)
	router.AddConsumerHandler("h", "orders", pubSub, func(msg *message.Message) error {
		if !failed.Swap(true) {
			return errHandler // nacked and redelivered, not poisoned
		}
		handled.Add(1)
		return nil
	})
	poisoned, err := pubSub.Subscribe(t.Context(), "poison")
	if err != nil {
		t.Fatal(err)
	}
	runRouter(t, router)

	bad := eventMessage("")
	go func() { _ = pubSub.Publish("orders", bad) }()
	select {
	case m := <-poisoned:
		m.Ack()
		if m.UUID != bad.UUID || !strings.Contains(m.Metadata.Get(middleware.ReasonForPoisonedKey), "event_id") {
			t.Errorf("poisoned %s with reason %q, want %s for its missing event_id", m.UUID, m.Metadata.Get(middleware.ReasonForPoisonedKey), bad.UUID)
		}
	case <-time.After(wait.Stall):
		t.Fatal("the message without event_id never reached the poison topic")
	}
	if err := pubSub.Publish("orders", eventMessage(uuid.NewString())); err != nil {
		t.Fatal(err)
	}
	if handled.Load() != 1 {
		t.Errorf("handled %d messages, want 1 (after one failed attempt)", handled.Load())
	}
}

func newRouter(t *testing.T) *message.Router {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func runRouter(t *testing.T, r *message.Router) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
	})
	select {
	case <-r.Running():
	case <-time.After(wait.Stall):
		t.Fatal("router did not start")
	}
}

// TestTwoRoutersRaceDuplicates is the concurrent-duplicate race through
// the real middleware: two routers of one consumer group on one database,
// both subscribed to an in-process topic that fans every message out to
// both, and every event published twice at once, so that four deliveries
// of each event run concurrently; handlers also fail now and then and are
// redelivered. Every event must take effect exactly once in the consumer's
// own table.
func TestTwoRoutersRaceDuplicates(t *testing.T) {
	for _, b := range fixtures.InboxBackends[:2] {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			f, ib, _ := b.NewSQLInbox(t, false)
			pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
			t.Cleanup(func() { pubSub.Close() })
			var runs, fails, delivered atomic.Int64
			var rmu sync.Mutex
			rng := rand.New(rand.NewPCG(1, 2))
			for range 2 {
				mw, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: "inventory"})
				if err != nil {
					t.Fatal(err)
				}
				count := func(h message.HandlerFunc) message.HandlerFunc {
					return func(msg *message.Message) ([]*message.Message, error) {
						delivered.Add(1)
						return h(msg)
					}
				}
				r := newRouter(t)
				r.AddMiddleware(count, mw)
				r.AddConsumerHandler("inventory", "orders", pubSub, func(msg *message.Message) error {
					runs.Add(1)
					if err := f.Effect(msg.Context(), msg.Metadata.Get(core.HeaderEventID)); err != nil {
						return err
					}
					time.Sleep(2 * time.Millisecond) // widen the window the duplicates race in
					rmu.Lock()
					fail := rng.Float64() < 0.1
					rmu.Unlock()
					if fail {
						fails.Add(1)
						return errHandler
					}
					return nil
				})
				runRouter(t, r)
			}
			const n = 40
			evIDs := make([]string, n)
			for i := range evIDs {
				evIDs[i] = uuid.NewString()
			}
			// Publish blocks until both routers acked, so when both
			// publishers return every delivery has been handled.
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for _, id := range evIDs {
						if err := pubSub.Publish("orders", eventMessage(id)); err != nil {
							t.Error(err)
						}
					}
				}()
			}
			wg.Wait()
			effects, err := f.Effects(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range evIDs {
				if effects[id] != 1 {
					t.Errorf("event %s took effect %d times, want 1", id, effects[id])
				}
			}
			if len(effects) != n {
				t.Errorf("%d distinct effects, want %d", len(effects), n)
			}
			if got := runs.Load() - fails.Load(); got != n {
				t.Errorf("%d successful handler runs, want %d", got, n)
			}
			if d := delivered.Load(); d < 4*n {
				t.Errorf("%d deliveries reached the middleware, want at least %d (4 per event)", d, 4*n)
			}
			t.Logf("%d events: %d deliveries, %d handler runs (%d failed and redelivered), %d duplicates skipped",
				n, delivered.Load(), runs.Load(), fails.Load(), delivered.Load()-runs.Load())
		})
	}
}

func inboxProcessed(t *testing.T, f *outboxtest.InboxFixture, consumer, id string, want bool) {
	t.Helper()
	got, err := f.Processed(t.Context(), consumer, id)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("record (%s, %s) present = %v, want %v", consumer, id, got, want)
	}
}

// A CloudEvent from a producer other than the relay (no event_id) is
// deduplicated on its id: from the binary mode's metadata of each binding,
// or from a structured-mode body.
func TestCloudEventID(t *testing.T) {
	f, ib, _ := sqliteFixture(t)
	mw, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: "ce"})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	h := mw(func(msg *message.Message) ([]*message.Message, error) {
		seen = append(seen, msg.UUID)
		return nil, nil
	})
	binary := func(key, id string) *message.Message {
		msg := message.NewMessage(uuid.NewString(), message.Payload(`{"n":1}`))
		msg.Metadata.Set(key, id)
		return msg
	}
	structured := func(id string) *message.Message {
		return message.NewMessage(uuid.NewString(), message.Payload(`{"specversion":"1.0","id":"`+id+`","type":"t","source":"/s","data":{}}`))
	}
	for _, key := range []string{"ce-id", "ce_id", "cloudEvents:id", "cloudEvents_id"} {
		id := uuid.NewString()
		for range 2 {
			if _, err := h(binary(key, id)); err != nil {
				t.Fatalf("%s: %v", key, err)
			}
		}
		inboxProcessed(t, f, "ce", id, true)
	}
	id := uuid.NewString()
	for range 2 {
		if _, err := h(structured(id)); err != nil {
			t.Fatalf("structured: %v", err)
		}
	}
	inboxProcessed(t, f, "ce", id, true)
	if len(seen) != 5 {
		t.Errorf("the handler ran %d times for 5 CloudEvents each delivered twice, want 5", len(seen))
	}
	// A JSON body that is no CloudEvent has no id.
	msg := message.NewMessage(uuid.NewString(), message.Payload(`{"id":"x"}`))
	if _, err := h(msg); !inbox.IsMissingEventID(err) {
		t.Errorf("a plain JSON body with an id field: %v, want ErrMissingEventID", err)
	}
}
