// Package pgnotify wakes txoutbox relays in other processes with PostgreSQL
// LISTEN/NOTIFY, so that they claim new events within milliseconds instead
// of at their next poll.
//
// It has two halves, each with a connection of its own (github.com/jackc/pgx/v5):
//
//   - Notifier, on the producer side, is a core.Notifier to pass as the
//     Notifier option of a storage adapter (sqlxoutbox.Options.Notifier).
//     Its Notify never blocks and never touches the producer's transaction:
//     a NOTIFY inside every producer transaction takes a global lock at
//     commit and costs a large share of writer throughput. The Notifier
//     sends pg_notify from its own connection instead, at most once per
//     Debounce window, so a burst of a thousand enqueues costs one NOTIFY.
//   - Listener, on the relay side, LISTENs on the channel and calls a
//     core.Notifier, normally the *core.Relay, for every notification. It
//     reconnects with backoff when its connection drops, and wakes the relay
//     once after every (re)connect in case it missed something meanwhile.
//
// A notification can overtake the commit it announces, because the producer
// calls Notify before its transaction commits; the relay copes (a woken
// relay that finds nothing looks again a few times within milliseconds). A
// notification can also be lost (connection down, server restart): the
// relay's poll interval is the fallback that bounds the delay then, so keep
// it, at a relaxed value such as a few seconds.
//
// Wiring, producer process:
//
//	n, _ := pgnotify.NewNotifier(dsn, pgnotify.NotifierOptions{})
//	go n.Run(ctx)
//	outbox, _ := sqlxoutbox.New(db, sqlxoutbox.Options{Notifier: n})
//
// and relay process:
//
//	relay, _ := core.NewRelay(outbox, pub, core.RelayOptions{PollInterval: 5 * time.Second})
//	l, _ := pgnotify.NewListener(dsn, relay, pgnotify.ListenerOptions{})
//	go l.Run(ctx)
//	relay.Run(ctx)
//
// A service on pgx builds both from its pool's configuration, with nothing
// else to connect with:
//
//	n, _ := pgnotify.NewNotifierConfig(pool.Config().ConnConfig, pgnotify.NotifierOptions{})
//	outbox, _ := pgxoutbox.New(pool, pgxoutbox.Options{Notifier: n})
//	l, _ := pgnotify.NewListenerConfig(pool.Config().ConnConfig, relay, pgnotify.ListenerOptions{})
//
// When producers and the relay share a process and a database handle, they
// need none of this: every adapter's writes wake the relays on the same
// handle and table directly (core.WakeupSource).
package pgnotify

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/txoutbox/core"
)

// DefaultChannel is the notification channel when none is configured.
const DefaultChannel = "txoutbox_events"

// Defaults of the options.
const (
	DefaultDebounce    = time.Millisecond
	DefaultMaxDebounce = 4 * time.Millisecond
	DefaultMinBackoff  = 100 * time.Millisecond
	DefaultMaxBackoff  = 10 * time.Second
)

// ErrAlreadyRunning is returned by Run when the Listener or Notifier is
// already running: each owns one connection and one loop.
var ErrAlreadyRunning = errors.New("pgnotify: already running")

// ErrPooledListen means the Listener's connection goes through a pooler in
// transaction mode (PgBouncer's pool_mode = transaction): its LISTEN ran on
// a server connection that went back to the pool, so no notification would
// reach it. Connect the Listener to PostgreSQL directly, or leave the
// relay to its polling (RelayOptions.PollInterval).
var ErrPooledListen = errors.New("pgnotify: LISTEN does not stick through a pooler in transaction mode")

// maxChannelLen is PostgreSQL's identifier limit (NAMEDATALEN - 1): longer
// channel names are truncated by LISTEN but not by pg_notify, so the two
// halves would silently miss each other.
const maxChannelLen = 63

func checkChannel(ch string) (string, error) {
	if ch == "" {
		ch = DefaultChannel
	}
	if len(ch) > maxChannelLen {
		return "", fmt.Errorf("%w: channel %q is longer than %d bytes", core.ErrInvalidOptions, ch, maxChannelLen)
	}
	for i := 0; i < len(ch); i++ {
		if ch[i] == 0 {
			return "", fmt.Errorf("%w: channel contains NUL", core.ErrInvalidOptions)
		}
	}
	return ch, nil
}

func parseConfig(connString string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("%w: parse connection string: %w", core.ErrInvalidOptions, err)
	}
	return cfg, nil
}

// ownConfig returns a copy of cfg, named appName in pg_stat_activity unless
// cfg names itself: the caller's cfg (a pool's) is left as it was.
func ownConfig(cfg *pgx.ConnConfig, appName string) (*pgx.ConnConfig, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: nil *pgx.ConnConfig", core.ErrInvalidOptions)
	}
	cfg = cfg.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = appName
	}
	return cfg, nil
}

// backoff is a capped exponential backoff with full jitter in its upper half,
// so that many relays cut off by one server restart do not reconnect in
// lockstep.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return b.cur/2 + rand.N(b.cur/2+1)
}

func (b *backoff) reset() { b.cur = 0 }

func checkBackoff(minB, maxB time.Duration) (time.Duration, time.Duration, error) {
	if minB < 0 || maxB < 0 {
		return 0, 0, fmt.Errorf("%w: negative backoff", core.ErrInvalidOptions)
	}
	if minB == 0 {
		minB = DefaultMinBackoff
	}
	if maxB == 0 {
		maxB = max(DefaultMaxBackoff, minB)
	}
	if maxB < minB {
		return 0, 0, fmt.Errorf("%w: MaxBackoff %v below MinBackoff %v", core.ErrInvalidOptions, maxB, minB)
	}
	return minB, maxB, nil
}
