package pgnotify

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/txoutbox/core"
)

// ListenerOptions configures a Listener. Zero fields take their defaults.
type ListenerOptions struct {
	// Channel to LISTEN on; it must match the Notifier's. Default
	// DefaultChannel.
	Channel string
	// MinBackoff and MaxBackoff bound the wait before a reconnect; it
	// doubles per failed attempt, with jitter. Defaults DefaultMinBackoff
	// and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives connection errors and reconnects. Default
	// slog.Default().
	Logger *slog.Logger
}

// ListenerStats are running totals of a Listener.
type ListenerStats struct {
	// Connects counts successful LISTENs, the first one included.
	Connects int64
	// Notifications counts notifications received on the channel.
	Notifications int64
	// Errors counts failed connects and lost connections.
	Errors int64
}

// Listener LISTENs on a channel and calls its target for every notification.
// Create it with NewListener and run it with Run.
type Listener struct {
	cfg     *pgx.ConnConfig
	target  core.Notifier
	channel string
	opts    ListenerOptions
	log     *slog.Logger

	running   atomic.Bool
	readyOnce sync.Once
	ready     chan struct{}
	pid       atomic.Uint32

	connects, notifications, errs atomic.Int64
}

// NewListener returns a Listener that connects with connString (a pgx
// connection string or URL) and calls target.Notify for every notification
// on the channel. target is typically the *core.Relay.
func NewListener(connString string, target core.Notifier, opts ListenerOptions) (*Listener, error) {
	cfg, err := parseConfig(connString)
	if err != nil {
		return nil, err
	}
	return NewListenerConfig(cfg, target, opts)
}

// NewListenerConfig is NewListener with a parsed configuration: from a pgx
// pool, pool.Config().ConnConfig, so that a service on pgx needs nothing
// else. The Listener connects with a copy of cfg, outside the pool (LISTEN
// holds its connection for as long as it runs).
func NewListenerConfig(cfg *pgx.ConnConfig, target core.Notifier, opts ListenerOptions) (*Listener, error) {
	if target == nil {
		return nil, fmt.Errorf("%w: NewListener needs a target Notifier", core.ErrInvalidOptions)
	}
	ch, err := checkChannel(opts.Channel)
	if err != nil {
		return nil, err
	}
	if opts.MinBackoff, opts.MaxBackoff, err = checkBackoff(opts.MinBackoff, opts.MaxBackoff); err != nil {
		return nil, err
	}
	if cfg, err = ownConfig(cfg, "txoutbox-listener"); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	opts.Channel = ch
	return &Listener{cfg: cfg, target: target, channel: ch, opts: opts, log: opts.Logger.With("channel", ch), ready: make(chan struct{})}, nil
}

// Ready returns a channel that is closed once the first LISTEN succeeded;
// notifications sent before that are not seen (the relay's first claim or
// poll covers them).
func (l *Listener) Ready() <-chan struct{} { return l.ready }

// BackendPID returns the server process id of the current connection, 0
// while disconnected. Operators and tests use it to find the session in
// pg_stat_activity.
func (l *Listener) BackendPID() uint32 { return l.pid.Load() }

// Stats returns the running totals.
func (l *Listener) Stats() ListenerStats {
	return ListenerStats{Connects: l.connects.Load(), Notifications: l.notifications.Load(), Errors: l.errs.Load()}
}

// Run listens until ctx is cancelled, reconnecting with backoff whenever the
// connection fails, and returns nil then. After every successful LISTEN it
// calls the target once, because events may have been enqueued while it was
// not listening. It returns ErrAlreadyRunning if called twice concurrently.
func (l *Listener) Run(ctx context.Context) error {
	if !l.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer l.running.Store(false)
	b := backoff{min: l.opts.MinBackoff, max: l.opts.MaxBackoff}
	for {
		err := l.session(ctx, &b)
		if ctx.Err() != nil {
			return nil
		}
		l.errs.Add(1)
		wait := b.next()
		l.log.Warn("pgnotify: listener connection lost; relay falls back to polling until it is back", "error", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// session connects, listens and delivers notifications until the
// connection fails or ctx ends.
func (l *Listener) session(ctx context.Context, b *backoff) error {
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return fmt.Errorf("pgnotify: connect: %w", err)
	}
	defer func() {
		l.pid.Store(0)
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		return fmt.Errorf("pgnotify: listen: %w", err)
	}
	l.pid.Store(conn.PgConn().PID())
	if n := l.connects.Add(1); n > 1 {
		l.log.Info("pgnotify: listener reconnected", "connects", n)
	}
	b.reset()
	l.readyOnce.Do(func() { close(l.ready) })
	// Whatever was announced while we were away is waiting: claim it now
	// rather than at the next poll.
	l.target.Notify()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("pgnotify: wait for notification: %w", err)
		}
		l.notifications.Add(1)
		l.target.Notify()
	}
}
