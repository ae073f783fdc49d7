package pgnotify

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/txoutbox/core"
)

// NotifierOptions configures a Notifier. Zero fields take their defaults.
type NotifierOptions struct {
	// Channel to NOTIFY; it must match the Listeners'. Default
	// DefaultChannel.
	Channel string
	// Debounce is the shortest time between two NOTIFYs: the first Notify
	// after a quiet spell is sent at once, and every Notify within the
	// following window is folded into one more NOTIFY at its end. It caps
	// the NOTIFY rate at 1/Debounce whatever the enqueue rate, and adds at
	// most Debounce to the wake-up of a relay. Default DefaultDebounce
	// (1 ms, i.e. at most 1000 NOTIFYs per second).
	Debounce time.Duration
	// MaxDebounce bounds the window when requests keep coming: after a
	// window in which a Notify arrived, the next window is twice as long,
	// up to MaxDebounce; a window without any resets it to Debounce. A
	// steady stream of enqueues keeps a woken relay claiming on its own (it
	// looks again every millisecond while it finds events), so NOTIFYs at
	// the full 1/Debounce rate only cost the database transactions its
	// producers need. Default DefaultMaxDebounce (4 ms); never below
	// Debounce.
	MaxDebounce time.Duration
	// SynchronousCommit keeps the server's synchronous_commit setting for
	// the Notifier's connection. By default the connection runs with
	// synchronous_commit=off: a NOTIFY is a transaction that writes a
	// commit record, and waiting for its WAL flush buys nothing, since a
	// notification lost in a crash only delays a relay until its poll.
	SynchronousCommit bool
	// MinBackoff and MaxBackoff bound the wait before a reconnect after a
	// failed NOTIFY; notifications asked for meanwhile are coalesced.
	// Defaults DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives connection errors. Default slog.Default().
	Logger *slog.Logger
}

// NotifierStats are running totals of a Notifier.
type NotifierStats struct {
	// Requested counts Notify calls.
	Requested int64
	// Sent counts NOTIFYs the server accepted.
	Sent int64
	// Errors counts failed connects and NOTIFYs; each drops one wake-up,
	// which the relays' poll makes up for.
	Errors int64
}

// Notifier is the producer's side: a core.Notifier whose Notify asks for a
// NOTIFY that its Run loop sends, debounced, from a connection of its own.
// Create it with NewNotifier. Notify is safe for concurrent use; before Run
// starts (or after it returned) Notify only records the request.
type Notifier struct {
	cfg     *pgx.ConnConfig
	channel string
	opts    NotifierOptions
	log     *slog.Logger
	signal  chan struct{}

	running atomic.Bool
	pid     atomic.Uint32

	requested, sent, errs atomic.Int64
}

var _ core.Notifier = (*Notifier)(nil)

// NewNotifier returns a Notifier that connects with connString (a pgx
// connection string or URL) and sends pg_notify on the channel.
func NewNotifier(connString string, opts NotifierOptions) (*Notifier, error) {
	cfg, err := parseConfig(connString)
	if err != nil {
		return nil, err
	}
	return NewNotifierConfig(cfg, opts)
}

// NewNotifierConfig is NewNotifier with a parsed configuration: from a pgx
// pool, pool.Config().ConnConfig, so that a service on pgx needs nothing
// else. The Notifier connects with a copy of cfg, outside the pool, so
// that a busy pool never delays a wake-up.
func NewNotifierConfig(cfg *pgx.ConnConfig, opts NotifierOptions) (*Notifier, error) {
	ch, err := checkChannel(opts.Channel)
	if err != nil {
		return nil, err
	}
	if opts.Debounce < 0 {
		return nil, fmt.Errorf("%w: negative Debounce", core.ErrInvalidOptions)
	}
	if opts.Debounce == 0 {
		opts.Debounce = DefaultDebounce
	}
	if opts.MaxDebounce < 0 {
		return nil, fmt.Errorf("%w: negative MaxDebounce", core.ErrInvalidOptions)
	}
	if opts.MaxDebounce == 0 {
		opts.MaxDebounce = max(DefaultMaxDebounce, opts.Debounce)
	}
	if opts.MaxDebounce < opts.Debounce {
		return nil, fmt.Errorf("%w: MaxDebounce %v below Debounce %v", core.ErrInvalidOptions, opts.MaxDebounce, opts.Debounce)
	}
	if opts.MinBackoff, opts.MaxBackoff, err = checkBackoff(opts.MinBackoff, opts.MaxBackoff); err != nil {
		return nil, err
	}
	if cfg, err = ownConfig(cfg, "txoutbox-notifier"); err != nil {
		return nil, err
	}
	if _, set := cfg.RuntimeParams["synchronous_commit"]; !set && !opts.SynchronousCommit {
		cfg.RuntimeParams["synchronous_commit"] = "off"
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	opts.Channel = ch
	return &Notifier{cfg: cfg, channel: ch, opts: opts, log: opts.Logger.With("channel", ch), signal: make(chan struct{}, 1)}, nil
}

// Channel returns the channel the Notifier notifies.
func (n *Notifier) Channel() string { return n.channel }

// Options returns the options with defaults applied.
func (n *Notifier) Options() NotifierOptions { return n.opts }

// BackendPID returns the server process id of the current connection, 0
// while disconnected.
func (n *Notifier) BackendPID() uint32 { return n.pid.Load() }

// Stats returns the running totals.
func (n *Notifier) Stats() NotifierStats {
	return NotifierStats{Requested: n.requested.Load(), Sent: n.sent.Load(), Errors: n.errs.Load()}
}

// Notify implements core.Notifier: it asks for a NOTIFY and returns at once.
// It is called from Enqueue, inside the producer's transaction, and does no
// I/O there.
func (n *Notifier) Notify() {
	n.requested.Add(1)
	select {
	case n.signal <- struct{}{}:
	default: // one is pending already: this request is folded into it
	}
}

// Run sends the requested NOTIFYs until ctx is cancelled, and returns nil
// then. It connects lazily and reconnects with backoff after a failure. It
// returns ErrAlreadyRunning if called twice concurrently.
func (n *Notifier) Run(ctx context.Context) error {
	if !n.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer n.running.Store(false)
	var conn *pgx.Conn
	defer func() { n.close(conn) }()
	b := backoff{min: n.opts.MinBackoff, max: n.opts.MaxBackoff}
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	sleep := func(d time.Duration) bool {
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		}
	}
	window := n.opts.Debounce
	for {
		select {
		case <-n.signal:
			// Asked for during the last window: requests keep coming.
			window = min(2*window, n.opts.MaxDebounce)
		default:
			window = n.opts.Debounce
			select {
			case <-ctx.Done():
				return nil
			case <-n.signal:
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		var err error
		if conn, err = n.send(ctx, conn); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			n.errs.Add(1)
			n.close(conn)
			conn = nil
			wait := b.next()
			n.log.Warn("pgnotify: NOTIFY failed; relays fall back to polling", "error", err, "retry_in", wait)
			if !sleep(wait) {
				return nil
			}
			continue
		}
		b.reset()
		n.sent.Add(1)
		// Requests during the window leave n.signal set, so the loop sends
		// exactly one more NOTIFY for all of them when the window ends.
		if !sleep(window) {
			return nil
		}
	}
}

func (n *Notifier) send(ctx context.Context, conn *pgx.Conn) (*pgx.Conn, error) {
	if conn == nil {
		c, err := pgx.ConnectConfig(ctx, n.cfg)
		if err != nil {
			return nil, fmt.Errorf("pgnotify: connect: %w", err)
		}
		conn = c
		n.pid.Store(conn.PgConn().PID())
	}
	if _, err := conn.Exec(ctx, "SELECT pg_notify($1, '')", n.channel); err != nil {
		return conn, fmt.Errorf("pgnotify: notify: %w", err)
	}
	return conn, nil
}

func (n *Notifier) close(conn *pgx.Conn) {
	if conn == nil {
		return
	}
	n.pid.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
