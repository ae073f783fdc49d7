package seal_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"gocloud.dev/secrets"
	"gocloud.dev/secrets/localsecrets"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/seal"
)

func newKey(t testing.TB, id string) seal.Key {
	t.Helper()
	k, err := localsecrets.NewRandomKey()
	if err != nil {
		t.Fatal(err)
	}
	keeper := localsecrets.NewKeeper(k)
	t.Cleanup(func() { keeper.Close() })
	return seal.Key{ID: id, Keeper: keeper}
}

func newSealer(t testing.TB, opts seal.Options) *seal.Sealer {
	t.Helper()
	s, err := seal.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func event(id string) core.Event {
	return core.Event{
		ID: id, AggregateType: "customer", AggregateID: "7", EventType: "customer.updated",
		Payload: json.RawMessage(`{"email":"ada@example.com","n":1}`),
		Headers: map[string]string{"tenant": "t1", "ssn": "123-45-6789"},
	}
}

func TestSealThenOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSealer(t, seal.Options{Key: newKey(t, "k1"), Headers: []string{"ssn"}})
	ev := event("0193a8a0-0000-7000-8000-000000000001")
	orig := event(ev.ID)
	if err := s.Seal(ctx, &ev); err != nil {
		t.Fatal(err)
	}
	if !seal.IsSealed(ev.Payload) || seal.KeyID(ev.Payload) != "k1" || strings.Contains(string(ev.Payload), "ada@") {
		t.Fatalf("sealed payload %s: want an envelope of key k1 without the plaintext", ev.Payload)
	}
	if !json.Valid(ev.Payload) {
		t.Fatalf("sealed payload is not JSON: the outbox column could not hold it")
	}
	if ev.Headers["tenant"] != "t1" || strings.Contains(ev.Headers["ssn"], "6789") {
		t.Fatalf("headers %v: want tenant in clear and ssn sealed", ev.Headers)
	}
	// Sealing twice changes nothing.
	again := ev
	if err := s.Seal(ctx, &again); err != nil || string(again.Payload) != string(ev.Payload) {
		t.Fatalf("second seal changed the event: %v", err)
	}
	claimHeaders := ev.Headers
	if err := s.Open(ctx, &ev); err != nil {
		t.Fatal(err)
	}
	if string(ev.Payload) != string(orig.Payload) || ev.Headers["ssn"] != orig.Headers["ssn"] || ev.Headers["tenant"] != "t1" {
		t.Fatalf("opened %s %v, want %s %v", ev.Payload, ev.Headers, orig.Payload, orig.Headers)
	}
	if claimHeaders["ssn"] == orig.Headers["ssn"] {
		t.Fatalf("Open wrote into the caller's header map")
	}
	// An event in clear opens as itself.
	plain := event(ev.ID)
	if err := s.Open(ctx, &plain); err != nil || string(plain.Payload) != string(orig.Payload) {
		t.Fatalf("open of an unsealed event: %v", err)
	}
}

// TestOneDataKeyPerWindow: events sealed within DataKeyLifetime share one
// wrapped data key (one keeper call), and a new window makes a new one.
func TestOneDataKeyPerWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dks := func(s *seal.Sealer, n int) map[string]bool {
		seen := map[string]bool{}
		for i := 0; i < n; i++ {
			ev := event("0193a8a0-0000-7000-8000-00000000000" + string(rune('0'+i%10)))
			if err := s.Seal(ctx, &ev); err != nil {
				t.Fatal(err)
			}
			var env struct{ DK string }
			if err := json.Unmarshal(ev.Payload, &env); err != nil {
				t.Fatal(err)
			}
			seen[env.DK] = true
		}
		return seen
	}
	if n := len(dks(newSealer(t, seal.Options{Key: newKey(t, "k1")}), 500)); n != 1 {
		t.Fatalf("500 events in one window used %d data keys, want 1", n)
	}
	if n := len(dks(newSealer(t, seal.Options{Key: newKey(t, "k1"), DataKeyLifetime: time.Nanosecond}), 20)); n < 10 {
		t.Fatalf("20 events over expired windows used %d data keys, want a new one per window", n)
	}
}

// TestRotation: after a rotation the old key still opens old events; a
// Sealer without the key fails with a permanent ErrOpen that names it.
func TestRotation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	k1, k2 := newKey(t, "2026-11"), newKey(t, "2026-12")
	before := newSealer(t, seal.Options{Key: k1})
	after := newSealer(t, seal.Options{Key: k2, OldKeys: []seal.Key{k1}})
	oldEv, newEv := event("0193a8a0-0000-7000-8000-00000000000a"), event("0193a8a0-0000-7000-8000-00000000000b")
	if err := before.Seal(ctx, &oldEv); err != nil {
		t.Fatal(err)
	}
	if err := after.Seal(ctx, &newEv); err != nil {
		t.Fatal(err)
	}
	if seal.KeyID(oldEv.Payload) != "2026-11" || seal.KeyID(newEv.Payload) != "2026-12" {
		t.Fatalf("key IDs %q %q", seal.KeyID(oldEv.Payload), seal.KeyID(newEv.Payload))
	}
	for _, ev := range []core.Event{oldEv, newEv} {
		if err := after.Open(ctx, &ev); err != nil || !strings.Contains(string(ev.Payload), "ada@") {
			t.Fatalf("open after rotation: %v", err)
		}
	}
	onlyNew := newSealer(t, seal.Options{OldKeys: []seal.Key{k2}})
	err := onlyNew.Open(ctx, &oldEv)
	if !errors.Is(err, seal.ErrOpen) || !core.IsPermanent(err) || !strings.Contains(err.Error(), `"2026-11"`) {
		t.Fatalf("open with a missing key: %v; want a permanent ErrOpen naming 2026-11", err)
	}
	if err := onlyNew.Seal(ctx, &newEv); !errors.Is(err, core.ErrInvalidOptions) {
		t.Fatalf("seal without a Key: %v", err)
	}
}

// TestTamperingIsRefused: an altered ciphertext, or a payload moved to
// another event, does not open.
func TestTamperingIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSealer(t, seal.Options{Key: newKey(t, "k1"), Headers: []string{"ssn"}})
	ev := event("0193a8a0-0000-7000-8000-00000000000c")
	if err := s.Seal(ctx, &ev); err != nil {
		t.Fatal(err)
	}
	var env map[string]any
	_ = json.Unmarshal(ev.Payload, &env)
	ct, _ := base64.StdEncoding.DecodeString(env["ct"].(string))
	ct[0] ^= 1
	env["ct"] = base64.StdEncoding.EncodeToString(ct)
	altered := ev
	altered.Payload, _ = json.Marshal(env)
	moved := ev
	moved.ID = "0193a8a0-0000-7000-8000-00000000000d"
	header := ev
	header.Headers = map[string]string{"ssn": ev.Headers["ssn"][:len(ev.Headers["ssn"])-4] + "AAA="}
	for name, bad := range map[string]core.Event{"altered": altered, "moved": moved, "header": header} {
		if err := s.Open(ctx, &bad); !errors.Is(err, seal.ErrOpen) || !core.IsPermanent(err) {
			t.Errorf("%s: %v, want a permanent ErrOpen", name, err)
		}
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	t.Parallel()
	k := newKey(t, "k1")
	for name, opts := range map[string]seal.Options{
		"no key":       {},
		"bad id":       {Key: seal.Key{ID: "a b", Keeper: k.Keeper}},
		"no keeper":    {Key: seal.Key{ID: "k1"}},
		"duplicate":    {Key: k, OldKeys: []seal.Key{k}},
		"identity hdr": {Key: k, Headers: []string{core.HeaderEventID}},
		"lifetime":     {Key: k, DataKeyLifetime: -time.Second},
	} {
		if _, err := seal.New(opts); !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("%s: %v, want ErrInvalidOptions", name, err)
		}
	}
	s := newSealer(t, seal.Options{Key: k})
	ev := event("0193a8a0-0000-7000-8000-00000000000e")
	ev.Payload = json.RawMessage(`{"broken"`)
	if err := s.Seal(context.Background(), &ev); !errors.Is(err, core.ErrInvalidEvent) {
		t.Fatalf("invalid JSON: %v, want ErrInvalidEvent", err)
	}
}

// keeperOf opens a keeper URL, as a service configures one.
func keeperOf(t testing.TB, url string) *secrets.Keeper {
	t.Helper()
	k, err := secrets.OpenKeeper(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// A batch whose context carries a log position (core.WithPosition) is
// published whole or not at all: one event that cannot be opened fails it
// for good, the others fail with it and reach nothing. The publisher
// beneath is found through Unwrap.
func TestPublisherKeepsAPositionedBatchWhole(t *testing.T) {
	t.Parallel()
	producer := newSealer(t, seal.Options{Key: newKey(t, "k1")})
	stranger := newSealer(t, seal.Options{Key: newKey(t, "k9")})
	evs := []core.Event{event("a"), event("b")}
	for i, s := range []*seal.Sealer{producer, stranger} {
		if err := s.Seal(t.Context(), &evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	var got []core.Event
	inner := core.PublisherFunc(func(_ context.Context, evs []core.Event) error { got = append(got, evs...); return nil })
	pub := producer.Publisher(inner)
	if w, ok := pub.(core.PublisherWrapper); !ok || w.Unwrap() == nil {
		t.Fatal("the opening publisher does not unwrap")
	}
	err := pub.Publish(core.WithPosition(t.Context(), 7), evs)
	errs := core.EventErrors(err, len(evs))
	if errs[0] == nil || core.IsPermanent(errs[0]) || errs[1] == nil || !core.IsPermanent(errs[1]) || len(got) != 0 {
		t.Fatalf("errors %v, published %d: want the openable event failed transiently, the other for good, nothing published", errs, len(got))
	}
	// Without a position, the openable event goes alone.
	err = pub.Publish(t.Context(), evs)
	if errs := core.EventErrors(err, len(evs)); errs[0] != nil || errs[1] == nil || len(got) != 1 {
		t.Fatalf("errors %v, published %d: want the openable event published", errs, len(got))
	}
}
