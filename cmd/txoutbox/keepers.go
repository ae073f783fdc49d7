package main

import (
	"context"
	"fmt"
	"strings"

	"gocloud.dev/secrets"
	_ "gocloud.dev/secrets/awskms"       // awskms:// keepers
	_ "gocloud.dev/secrets/localsecrets" // base64key:// keepers

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/seal"
)

// keeperHelp documents --keeper.
const keeperHelp = `Sealed (encrypted) events (package seal): --keeper ID=URL, once per key
version, opens the events sealed with that key: the relay publishes them in
clear, and 'dead list --format json' shows their payload. Without the key a
sealed payload is shown as "encrypted" with its key ID, and the relay passes it
through sealed. URLs are gocloud.dev/secrets keepers: base64key://<32 bytes in
base64 URL encoding>, or awskms://<key ID or alias>?region=... (credentials
from the usual AWS sources). The value is a secret: prefer the TXOUTBOX_KEEPER
variable to the command line.`

// sealer returns the Sealer of the --keeper flags, nil without any; it
// keeps the keepers open until ctx ends.
func (a *app) sealer(ctx context.Context) (*seal.Sealer, error) {
	if len(a.keepers) == 0 {
		return nil, nil
	}
	var keys []seal.Key
	for _, kv := range a.keepers {
		id, u, ok := strings.Cut(kv, "=")
		if !ok || id == "" || !strings.Contains(u, "://") {
			return nil, usagef("--keeper %q: want ID=URL, e.g. 2026-12=base64key://...", redact(kv))
		}
		k, err := secrets.OpenKeeper(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("%w: --keeper %s: %s", ErrUsage, id, redact(err.Error()))
		}
		context.AfterFunc(ctx, func() { k.Close() })
		keys = append(keys, seal.Key{ID: id, Keeper: k})
	}
	s, err := seal.New(seal.Options{OldKeys: keys})
	if err != nil {
		return nil, fmt.Errorf("%w: --keeper: %w", ErrUsage, err)
	}
	return s, nil
}

// showable returns what an operator may see of ev's payload: the
// plaintext when the key is at hand, else nothing and the ID of the key
// that sealed it.
func showable(ctx context.Context, s *seal.Sealer, ev core.Event) (core.Event, string) {
	kid := seal.KeyID(ev.Payload)
	if kid == "" {
		return ev, ""
	}
	if s != nil && s.Open(ctx, &ev) == nil {
		return ev, ""
	}
	ev.Payload = nil
	h := make(map[string]string, len(ev.Headers))
	for k, v := range ev.Headers {
		if seal.IsSealedHeader(v) {
			v = "encrypted"
		}
		h[k] = v
	}
	ev.Headers = h
	return ev, kid
}
