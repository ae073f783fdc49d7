package outboxtest_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	memoutbox "github.com/txoutbox/txoutbox/adapters/memory"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// A check that cannot fail proves nothing. Each case below runs a suite on
// a deliberately broken adapter, in a child process (the suite fails the
// test it is given), and requires the failure the kit must report.
var brokenCases = map[string]struct {
	run  func(t *testing.T)
	want string // every line of it must be in the failure's output
}{
	// The crashed relay's claim never lets go of its events.
	"CrashKeepsTheClaim": {func(t *testing.T) {
		outboxtest.RunStore(t, func(t *testing.T) *outboxtest.StoreFixture {
			f := memFixture(memoutbox.New(memoutbox.Options{}))
			f.Crash = func(context.Context) error { return nil }
			return f
		})
	}, "the crashed claim still holds them"},
	// Two open claims are handed the same events.
	"ClaimsOverlap": {func(t *testing.T) {
		outboxtest.RunStore(t, func(t *testing.T) *outboxtest.StoreFixture {
			s := memoutbox.New(memoutbox.Options{})
			f := memFixture(s)
			f.Store = &overlappingStore{Store: s}
			return f
		})
	}, "held by two open claims"},
	// The store reports a wake-up signal and never notifies it.
	"WakeUpUnwired": {func(t *testing.T) {
		outboxtest.RunEndToEnd(t, func(t *testing.T) *outboxtest.StoreFixture {
			s := memoutbox.New(memoutbox.Options{})
			f := memFixture(s)
			f.Store = deafStore{s, &core.Signal{}}
			return f
		}, goChannelBroker(nil))
		// The failure says where the events stand (unpublished, 0
		// attempts) and that the relay never handed them over.
	}, "unpublished, 0 attempts\npublisher: 0 calls with 0 events, 0 returned"},
	// The publisher claims order and reverses every batch.
	"OrderBroken": {func(t *testing.T) {
		outboxtest.RunPublisher(t, goChannelBroker(func(p core.Publisher) core.Publisher { return reversing{p} }))
	}, "was due"},
	// The publisher drops the headers.
	"HeadersDropped": {func(t *testing.T) {
		outboxtest.RunPublisher(t, func(t *testing.T) *outboxtest.BrokerFixture {
			ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, watermill.NopLogger{})
			t.Cleanup(func() { ps.Close() })
			return &outboxtest.BrokerFixture{Publisher: headerless{ps}, Subscriber: ps}
		})
	}, `without an "event_id" header`},
	// One poison event fails its whole batch.
	"PoisonSpreads": {func(t *testing.T) {
		outboxtest.RunPublisher(t, goChannelBroker(func(p core.Publisher) core.Publisher { return touchy{p} }))
	}, "failed with the poison in its batch"},
	// The subscriber ignores the end of its context.
	"SubscriberIgnoresCancel": {func(t *testing.T) {
		outboxtest.RunPublisher(t, func(t *testing.T) *outboxtest.BrokerFixture {
			b := goChannelBroker(nil)(t)
			b.Subscriber = stubborn{b.Subscriber}
			return b
		})
	}, "ignores context cancellation"},
	// A decorator loses a capability.
	"DecoratorDropsCapability": {func(t *testing.T) {
		outboxtest.RequireStoreDecorator(t, func(s core.Store) core.Store { return forgetful{s} })
	}, "want the wrapped store's"},
	// A decorator hides the optional interfaces of the store it wraps.
	"DecoratorHidesOptionalInterfaces": {func(t *testing.T) {
		outboxtest.RequireStoreDecorator(t, func(s core.Store) core.Store { return opaque{s} })
	}, "does not find the wrapped store's wake-up signal"},
}

const brokenEnv = "OUTBOXTEST_BROKEN_CASE"

func TestKitCatchesBrokenAdapters(t *testing.T) {
	if name := os.Getenv(brokenEnv); name != "" {
		// The child: run the broken case; it is expected to fail.
		brokenCases[name].run(t)
		return
	}
	names := make([]string, 0, len(brokenCases))
	for name := range brokenCases {
		names = append(names, name)
	}
	slices.Sort(names)
	// Every child at once, whatever -parallel says: they spend their time
	// waiting out their delivery timeout, not on the CPU.
	type result struct {
		out []byte
		err error
	}
	results := make(map[string]chan result, len(names))
	for _, name := range names {
		ch := make(chan result, 1)
		results[name] = ch
		go func() {
			// A liveness limit only: the child fails on its own stall limits.
			ctx, cancel := context.WithTimeout(t.Context(), wait.Cap)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestKitCatchesBrokenAdapters$", "-test.v")
			cmd.Env = append(os.Environ(), brokenEnv+"="+name, "TXOUTBOX_TEST_DELIVERY_TIMEOUT=3s",
				// The child's waits end sooner than a minute: it is
				// meant to fail, and its own waits see progress in
				// milliseconds when nothing is broken.
				"TXOUTBOX_WAIT_STALL=15s")
			out, err := cmd.CombinedOutput()
			ch <- result{out, err}
		}()
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			r := <-results[name]
			out, err := r.out, r.err
			if err == nil {
				t.Fatalf("the suite passed a broken adapter (%s):\n%s", name, out)
			}
			for want := range strings.Lines(brokenCases[name].want) {
				if want = strings.TrimSuffix(want, "\n"); !strings.Contains(string(out), want) {
					t.Fatalf("the suite failed the broken adapter, but without %q:\n%s", want, out)
				}
			}
		})
	}
}

func memFixture(s *memoutbox.Store) *outboxtest.StoreFixture {
	return &outboxtest.StoreFixture{
		Store: s,
		Enqueue: func(ctx context.Context, evs []core.Event, commit bool) error {
			tx := s.Begin()
			if err := s.Enqueue(ctx, tx, evs...); err != nil {
				return err
			}
			if !commit {
				return tx.Rollback()
			}
			return tx.Commit()
		},
		EnqueueThenCommit: func(ctx context.Context, evs []core.Event) (error, error) {
			tx := s.Begin()
			err := s.Enqueue(ctx, tx, evs...)
			return err, tx.Commit()
		},
		Get:      s.Get,
		Backdate: s.Backdate,
		RetryDead: func(ctx context.Context, id string) error {
			_, err := s.RetryDead(ctx, id)
			return err
		},
		Crash: func(context.Context) error { s.Crash(); return nil },
	}
}

// goChannelBroker is a GoChannel broker whose publisher wrap may break.
func goChannelBroker(wrap func(core.Publisher) core.Publisher) outboxtest.NewBrokerFunc {
	return func(t *testing.T) *outboxtest.BrokerFixture {
		ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, watermill.NopLogger{})
		t.Cleanup(func() { ps.Close() })
		var pub core.Publisher = watermillbroker.NewPublisher(ps, watermillbroker.Options{PreservesAggregateOrder: true})
		if wrap != nil {
			pub = wrap(pub)
		}
		return &outboxtest.BrokerFixture{Publisher: pub, Subscriber: ps}
	}
}

// overlappingStore hands every claim the oldest pending events, whatever
// other open claims hold: the store of a relay that forgot SKIP LOCKED.
type overlappingStore struct {
	*memoutbox.Store
	mu        sync.Mutex
	published map[int64]bool
}

func (s *overlappingStore) Claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var evs []core.Event
	for _, ev := range s.Events() {
		if len(evs) < req.Limit && ev.PublishedAt == nil && !s.published[ev.Seq] {
			evs = append(evs, ev)
		}
	}
	return &unheldClaim{s: s, evs: evs}, nil
}

type unheldClaim struct {
	s   *overlappingStore
	evs []core.Event
}

func (c *unheldClaim) Events() []core.Event          { return c.evs }
func (c *unheldClaim) Release(context.Context) error { return nil }
func (c *unheldClaim) Commit(_ context.Context, out core.Outcome) error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.s.published == nil {
		c.s.published = map[int64]bool{}
	}
	for _, seq := range out.Published {
		c.s.published[seq] = true
	}
	return nil
}

// deafStore reports a signal it never notifies.
type deafStore struct {
	*memoutbox.Store
	sig *core.Signal
}

func (s deafStore) Wakeups() *core.Signal { return s.sig }

type reversing struct{ core.Publisher }

func (p reversing) Publish(ctx context.Context, evs []core.Event) error {
	r := slices.Clone(evs)
	slices.Reverse(r)
	return p.Publisher.Publish(ctx, r)
}

// headerless sends each payload with no metadata: a publisher that builds
// its own messages and forgets the headers.
type headerless struct{ pub message.Publisher }

func (headerless) Capabilities() core.PublisherCapabilities { return core.PublisherCapabilities{} }

func (p headerless) Publish(ctx context.Context, evs []core.Event) error {
	be := core.NewBatchError(len(evs))
	for i := range evs {
		if err := ctx.Err(); err != nil {
			be.Errs[i] = err
			continue
		}
		be.Errs[i] = p.pub.Publish(evs[i].EventType, message.NewMessage(evs[i].ID, message.Payload(evs[i].Payload)))
	}
	return be.ErrOrNil()
}

type touchy struct{ core.Publisher }

func (p touchy) Publish(ctx context.Context, evs []core.Event) error {
	for _, ev := range evs {
		for k := range ev.Headers {
			if len(k) > 255 {
				return core.Permanent(core.ErrInvalidEvent) // the whole batch
			}
		}
	}
	return p.Publisher.Publish(ctx, evs)
}

// stubborn hands out a channel that never closes.
type stubborn struct{ message.Subscriber }

func (s stubborn) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.Subscriber.Subscribe(context.WithoutCancel(ctx), topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		for m := range in {
			out <- m
		}
		select {} // never closes out
	}()
	return out, nil
}

// forgetful drops a capability.
type forgetful struct{ core.Store }

func (f forgetful) Capabilities() core.StoreCapabilities {
	c := f.Store.Capabilities()
	c.OrderedPartitions = false
	return c
}

func (f forgetful) Unwrap() core.Store { return f.Store }

// opaque forwards the required methods and has no Unwrap.
type opaque struct{ core.Store }
