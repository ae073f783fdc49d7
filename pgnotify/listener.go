package pgnotify

import (
	"context"
	"errors"
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
// connection fails, and returns nil then. It returns ErrPooledListen at
// once, after one error log with the fix, when its connection goes through
// a pooler in transaction mode, where LISTEN cannot work. After every successful LISTEN it
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
		if errors.Is(err, ErrPooledListen) {
			l.log.Error("pgnotify: the listener's connection goes through a pooler in transaction mode, where LISTEN does not stick: "+
				"no notification would arrive; connect the Listener to PostgreSQL directly (a DSN that bypasses PgBouncer), "+
				"or leave the relay to its polling; the listener stops", "error", err)
			return err
		}
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
	if err := l.checkListening(ctx, conn); err != nil {
		return err
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

// simple runs the checks unprepared, so that they work through a pooler
// whatever the connection's default_query_exec_mode.
const simple = pgx.QueryExecModeSimpleProtocol

// checkListening returns ErrPooledListen when conn's LISTEN did not stick
// to its session. A pooler hands the client a process ID of its own: when
// the server's pg_backend_pid() is the one the connection announced, the
// connection is the session and LISTEN sticks. Otherwise a probe
// connection holds a server connection in a transaction (a PgBouncer
// hands back the one just released, LISTEN's, first) while conn asks
// whether its session listens: in session pooling it still does; in
// transaction pooling the question runs on another server connection,
// which does not.
func (l *Listener) checkListening(ctx context.Context, conn *pgx.Conn) error {
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", simple).Scan(&pid); err != nil {
		return fmt.Errorf("pgnotify: check the session: %w", err)
	}
	if pid == conn.PgConn().PID() {
		return nil
	}
	probe, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return fmt.Errorf("pgnotify: connect the pooler probe: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = probe.Close(cctx)
	}()
	tx, err := probe.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgnotify: pooler probe: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a read-only probe
	if _, err := tx.Exec(ctx, "SELECT 1", simple); err != nil {
		return fmt.Errorf("pgnotify: pooler probe: %w", err)
	}
	var listening bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_listening_channels() AS c WHERE c = $1)", simple, l.channel).Scan(&listening); err != nil {
		return fmt.Errorf("pgnotify: check LISTEN: %w", err)
	}
	if !listening {
		return fmt.Errorf("%w (channel %q)", ErrPooledListen, l.channel)
	}
	return nil
}
