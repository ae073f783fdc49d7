// Package seal encrypts event payloads (and chosen headers) at rest in the
// outbox, and decrypts them for the broker.
//
// It is envelope encryption on gocloud.dev/secrets: events are sealed with
// AES-256-GCM under a data key, and the data key is wrapped by a keeper
// (base64key:// for a local key; awskms://, gcpkms://, azurekeyvault://,
// hashivault:// for a key management service: import the driver as
// gocloud.dev/secrets says). A data key serves every event sealed within
// Options.DataKeyLifetime, so the keeper is called once per window, not
// per event; its wrapped form travels in every sealed payload, with the ID
// of the key that wrapped it.
//
// Producers seal on Enqueue through Sealer.Hook, an EnqueueHook of every
// storage adapter. The relay opens what it publishes through
// Sealer.Publisher, so consumers see plaintext; a relay without it passes
// the sealed payloads through. Rotation: give the new key as Options.Key
// and keep the old ones in Options.OldKeys, and events sealed before still
// open. An event that cannot be opened (its key is not configured, or its
// ciphertext was altered) fails with ErrOpen, a permanent error: the relay
// dead-letters it at once, with a message that names the key.
//
// A sealed payload is a JSON object that names itself:
//
//	{"txoutbox_sealed":1,"key":"2026-12","dk":"...","nonce":"...","ct":"..."}
//
// so the outbox column, the archive, the CLI and a relay without the key
// all keep it as it is. The ciphertext is bound to the event's ID and the
// field (payload or header name), so it cannot be moved to another event.
package seal

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"sync"
	"time"

	"gocloud.dev/secrets"

	"github.com/txoutbox/txoutbox/core"
)

// ErrOpen means a sealed event could not be decrypted: its key is not
// configured, or its ciphertext or data key was altered. Errors wrapping it
// are permanent (core.IsPermanent).
var ErrOpen = errors.New("seal: cannot open a sealed event")

// Key is a keeper and the ID recorded in every event it seals.
type Key struct {
	// ID names the key version, e.g. "2026-12": letters, digits, '.',
	// '_' and '-', at most 64 bytes. It must stay the same for the life
	// of the events it sealed.
	ID string
	// Keeper wraps and unwraps the data keys (gocloud.dev/secrets).
	Keeper *secrets.Keeper
}

// Options configures a Sealer.
type Options struct {
	// Key seals new events. Required to seal; a Sealer that only opens
	// (a relay) may leave it empty and list its keys in OldKeys.
	Key Key
	// OldKeys open events sealed before a rotation.
	OldKeys []Key
	// Headers names the headers sealed with the payload. Other headers,
	// and the event's identity (type, aggregate, ID), stay in clear: the
	// relay and brokers route on them.
	Headers []string
	// DataKeyLifetime is how long one data key seals events before a new
	// one is made (one keeper call). Default 10 minutes.
	DataKeyLifetime time.Duration
}

var keyIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Sealer seals and opens events. Build one with New; it is safe for
// concurrent use.
type Sealer struct {
	opts    Options
	keys    map[string]*secrets.Keeper
	headers map[string]bool

	mu      sync.Mutex
	current *dataKey // sealing
	opened  map[string]cipher.AEAD
}

type dataKey struct {
	aead    cipher.AEAD
	wrapped string // base64
	expires time.Time
}

// maxOpenedKeys bounds the cache of unwrapped data keys: past it, the
// cache starts over (a keeper call per data key met again).
const maxOpenedKeys = 1024

// New returns the Sealer of opts.
func New(opts Options) (*Sealer, error) {
	s := &Sealer{opts: opts, keys: map[string]*secrets.Keeper{}, headers: map[string]bool{}, opened: map[string]cipher.AEAD{}}
	all := opts.OldKeys
	if opts.Key.ID != "" || opts.Key.Keeper != nil {
		all = append([]Key{opts.Key}, all...)
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("%w: seal.New needs a Key (or OldKeys to open with)", core.ErrInvalidOptions)
	}
	for _, k := range all {
		if !keyIDPattern.MatchString(k.ID) {
			return nil, fmt.Errorf("%w: seal key ID %q: want 1 to 64 letters, digits, '.', '_' or '-'", core.ErrInvalidOptions, k.ID)
		}
		if k.Keeper == nil {
			return nil, fmt.Errorf("%w: seal key %q has no keeper", core.ErrInvalidOptions, k.ID)
		}
		if _, dup := s.keys[k.ID]; dup {
			return nil, fmt.Errorf("%w: seal key ID %q given twice", core.ErrInvalidOptions, k.ID)
		}
		s.keys[k.ID] = k.Keeper
	}
	for _, h := range opts.Headers {
		if h == "" || isIdentityHeader(h) {
			return nil, fmt.Errorf("%w: header %q cannot be sealed (the relay and brokers read it)", core.ErrInvalidOptions, h)
		}
		s.headers[h] = true
	}
	switch {
	case opts.DataKeyLifetime < 0:
		return nil, fmt.Errorf("%w: negative DataKeyLifetime", core.ErrInvalidOptions)
	case opts.DataKeyLifetime == 0:
		s.opts.DataKeyLifetime = 10 * time.Minute
	}
	return s, nil
}

func isIdentityHeader(h string) bool {
	switch h {
	case core.HeaderEventID, core.HeaderEventType, core.HeaderAggregateType, core.HeaderAggregateID:
		return true
	}
	return false
}

// envelope is a sealed payload.
type envelope struct {
	Sealed int    `json:"txoutbox_sealed"`
	Key    string `json:"key"`
	DK     string `json:"dk"`
	Nonce  string `json:"nonce"`
	CT     string `json:"ct"`
}

// headerPrefix starts a sealed header value: base64 of nonce and
// ciphertext follow, under the data key of the payload's envelope.
const headerPrefix = "txoutbox-sealed:"

// Hook returns the EnqueueHook that seals each event as it is enqueued:
// give it to an adapter's Options.Hooks. It refuses a payload that is not
// valid JSON (it could not be checked once sealed).
func (s *Sealer) Hook() core.EnqueueHook {
	return func(ctx context.Context, ev *core.Event) error { return s.Seal(ctx, ev) }
}

// Seal encrypts ev's payload and the headers of Options.Headers in place.
// ev must have its ID (PrepareEvents gives it one before the hooks run).
// A payload sealed already is left as it is.
func (s *Sealer) Seal(ctx context.Context, ev *core.Event) error {
	if s.opts.Key.Keeper == nil {
		return fmt.Errorf("%w: this Sealer has no Key to seal with", core.ErrInvalidOptions)
	}
	if IsSealed(ev.Payload) {
		return nil
	}
	if !json.Valid(ev.Payload) {
		return fmt.Errorf("%w: payload is not valid JSON", core.ErrInvalidEvent)
	}
	if ev.ID == "" {
		return fmt.Errorf("%w: seal needs the event's ID", core.ErrInvalidEvent)
	}
	dk, err := s.dataKey(ctx)
	if err != nil {
		return err
	}
	env := envelope{Sealed: 1, Key: s.opts.Key.ID, DK: dk.wrapped}
	nonce, ct, err := seal(dk.aead, ev.Payload, aad(ev.ID, "payload"))
	if err != nil {
		return err
	}
	env.Nonce, env.CT = b64(nonce), b64(ct)
	if len(s.headers) > 0 && len(ev.Headers) > 0 {
		sealed := make(map[string]string, len(ev.Headers))
		for k, v := range ev.Headers {
			if s.headers[k] {
				n, c, err := seal(dk.aead, []byte(v), aad(ev.ID, "header:"+k))
				if err != nil {
					return err
				}
				v = headerPrefix + b64(append(n, c...))
			}
			sealed[k] = v
		}
		ev.Headers = sealed
	}
	p, err := json.Marshal(env)
	if err != nil {
		return fmt.Errorf("seal: %w", err)
	}
	ev.Payload = p
	return nil
}

func seal(aead cipher.AEAD, plain, ad []byte) (nonce, ct []byte, err error) {
	nonce = make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, nil, fmt.Errorf("seal: nonce: %w", err)
	}
	return nonce, aead.Seal(nil, nonce, plain, ad), nil
}

func aad(eventID, field string) []byte {
	return []byte("txoutbox-seal/1\x00" + eventID + "\x00" + field)
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// dataKey returns the data key of the current window, making and wrapping
// a new one when the last expired.
func (s *Sealer) dataKey(ctx context.Context) (*dataKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if dk := s.current; dk != nil && time.Now().Before(dk.expires) {
		return dk, nil
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("seal: data key: %w", err)
	}
	wrapped, err := s.opts.Key.Keeper.Encrypt(ctx, raw)
	if err != nil {
		return nil, fmt.Errorf("seal: wrap a data key with key %q: %w", s.opts.Key.ID, err)
	}
	aead, err := newAEAD(raw)
	if err != nil {
		return nil, err
	}
	dk := &dataKey{aead: aead, wrapped: b64(wrapped), expires: time.Now().Add(s.opts.DataKeyLifetime)}
	s.current = dk
	s.cacheOpened(s.opts.Key.ID+"/"+dk.wrapped, aead)
	return dk, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return cipher.NewGCM(block)
}

func (s *Sealer) cacheOpened(k string, aead cipher.AEAD) {
	if len(s.opened) >= maxOpenedKeys {
		clear(s.opened)
	}
	s.opened[k] = aead
}

// IsSealed reports whether payload is a sealed envelope. It parses the
// object: databases may store it with its keys reordered (jsonb does).
func IsSealed(payload []byte) bool {
	_, ok := parseEnvelope(payload)
	return ok
}

func parseEnvelope(payload []byte) (envelope, bool) {
	var env envelope
	if !bytes.Contains(payload, []byte(`"txoutbox_sealed"`)) || json.Unmarshal(payload, &env) != nil {
		return env, false
	}
	return env, env.Sealed == 1 && env.Key != "" && env.CT != ""
}

// IsSealedHeader reports whether a header value is sealed.
func IsSealedHeader(v string) bool { return strings.HasPrefix(v, headerPrefix) }

// KeyID returns the ID of the key that sealed payload, or "" when it is
// not sealed.
func KeyID(payload []byte) string {
	if env, ok := parseEnvelope(payload); ok {
		return env.Key
	}
	return ""
}

// Open decrypts ev's payload and sealed headers in place. An event that is
// not sealed is left as it is. Its errors wrap ErrOpen and are permanent.
func (s *Sealer) Open(ctx context.Context, ev *core.Event) error {
	env, ok := parseEnvelope(ev.Payload)
	if !ok {
		return nil
	}
	aead, err := s.openDataKey(ctx, env)
	if err != nil {
		return core.Permanent(fmt.Errorf("%w %s (seq %d): %w", ErrOpen, ev.ID, ev.Seq, err))
	}
	nonce, err1 := base64.StdEncoding.DecodeString(env.Nonce)
	ct, err2 := base64.StdEncoding.DecodeString(env.CT)
	if err1 != nil || err2 != nil || len(nonce) != aead.NonceSize() {
		return openErr(ev, "the envelope is malformed")
	}
	plain, err := aead.Open(nil, nonce, ct, aad(ev.ID, "payload"))
	if err != nil {
		return openErr(ev, fmt.Sprintf("the payload does not authenticate under key %q (altered, or moved from another event)", env.Key))
	}
	// A copy: the caller's map may be the claim's own (the relay's batch).
	var headers map[string]string
	for k, v := range ev.Headers {
		if !strings.HasPrefix(v, headerPrefix) {
			continue
		}
		if headers == nil {
			headers = maps.Clone(ev.Headers)
		}
		raw, err := base64.StdEncoding.DecodeString(v[len(headerPrefix):])
		if err != nil || len(raw) < aead.NonceSize() {
			return openErr(ev, fmt.Sprintf("header %q is malformed", k))
		}
		hv, err := aead.Open(nil, raw[:aead.NonceSize()], raw[aead.NonceSize():], aad(ev.ID, "header:"+k))
		if err != nil {
			return openErr(ev, fmt.Sprintf("header %q does not authenticate under key %q", k, env.Key))
		}
		headers[k] = string(hv)
	}
	ev.Payload = plain
	if headers != nil {
		ev.Headers = headers
	}
	return nil
}

func openErr(ev *core.Event, why string) error {
	return core.Permanent(fmt.Errorf("%w %s (seq %d): %s", ErrOpen, ev.ID, ev.Seq, why))
}

func (s *Sealer) openDataKey(ctx context.Context, env envelope) (cipher.AEAD, error) {
	ck := env.Key + "/" + env.DK
	s.mu.Lock()
	aead, ok := s.opened[ck]
	s.mu.Unlock()
	if ok {
		return aead, nil
	}
	keeper, ok := s.keys[env.Key]
	if !ok {
		return nil, fmt.Errorf("it was sealed with key %q, which is not configured (configured: %s)", env.Key, s.keyList())
	}
	wrapped, err := base64.StdEncoding.DecodeString(env.DK)
	if err != nil {
		return nil, errors.New("its data key is malformed")
	}
	raw, err := keeper.Decrypt(ctx, wrapped)
	if err != nil {
		return nil, fmt.Errorf("key %q cannot unwrap its data key: %w", env.Key, err)
	}
	aead, err = newAEAD(raw)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.cacheOpened(ck, aead)
	s.mu.Unlock()
	return aead, nil
}

func (s *Sealer) keyList() string {
	ids := make([]string, 0, len(s.keys))
	for id := range s.keys {
		ids = append(ids, id)
	}
	return strings.Join(ids, ", ")
}

// Publisher returns pub behind a step that opens each sealed event before
// it is published, so that consumers see plaintext. An event that cannot
// be opened fails alone, with a permanent error; the others are published.
// It keeps pub's capabilities.
func (s *Sealer) Publisher(pub core.Publisher) core.Publisher {
	return &opener{s: s, next: pub}
}

type opener struct {
	s    *Sealer
	next core.Publisher
}

func (o *opener) Capabilities() core.PublisherCapabilities { return o.next.Capabilities() }

// Unwrap implements core.PublisherWrapper.
func (o *opener) Unwrap() core.Publisher { return o.next }

func (o *opener) Publish(ctx context.Context, events []core.Event) error {
	out := make([]core.Event, 0, len(events))
	idx := make([]int, 0, len(events))
	be := core.NewBatchError(len(events))
	for i, ev := range events {
		if err := o.s.Open(ctx, &ev); err != nil {
			be.Errs[i] = err
			continue
		}
		out = append(out, ev)
		idx = append(idx, i)
	}
	if _, ok := core.PositionOf(ctx); ok && be.Failed() > 0 {
		// A position covers every event of the batch: publishing the
		// others with it would mark the failed ones handled.
		for _, i := range idx {
			be.Errs[i] = fmt.Errorf("seal: not published: another event of the batch could not be opened, and the batch carries a log position")
		}
		return be
	}
	if len(out) > 0 {
		err := o.next.Publish(ctx, out)
		var inner *core.BatchError
		switch {
		case err == nil:
		case errors.As(err, &inner) && len(inner.Errs) == len(out):
			for j, e := range inner.Errs {
				be.Errs[idx[j]] = e
			}
		default:
			if be.Failed() == 0 {
				return err
			}
			for _, i := range idx {
				be.Errs[i] = err
			}
		}
	}
	return be.ErrOrNil()
}
