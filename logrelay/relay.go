package logrelay

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/logstream"
	"github.com/txoutbox/txoutbox/logmode"
)

// Options configures a log-mode relay on PostgreSQL. Zero fields take
// their defaults.
type Options struct {
	// ConnString is the PostgreSQL connection string (URL or key=value)
	// of the outbox's database. The relay opens a replication connection
	// with it for the stream, and a small pool for the retry path.
	// Required.
	ConnString string
	// Names are the table, slot and publication (Setup created them).
	Names
	// Options are what every log-mode relay takes: the retry path's
	// RelayOptions, StandbyInterval, SpillAfter, HoldOnBrokerDown.
	logmode.Options
	// ServerTimeout is how long the server may stay silent before the
	// relay drops the connection and reconnects; the relay asks for a
	// reply every second. Time the relay spends waiting for a busy
	// publisher, reading nothing, does not count. It is also passed to the server as
	// wal_sender_timeout, so that the server frees the slot for a standby
	// this long after the streaming relay stopped answering. Default 10s.
	ServerTimeout time.Duration
	// ConfirmInterval is how long, at most, a confirmed position that
	// moved waits before the relay sends it to the server. Default 0: at
	// once (a move cuts the stream's current read short), so that a relay
	// killed at any point leaves little for its successor to send again.
	// Sending it costs a status message, no round trip. Longer values send
	// it with the status the relay sends every second anyway.
	ConfirmInterval time.Duration
}

// source is PostgreSQL's logical replication slot as logmode reads it.
type source struct {
	opts   Options
	names  resolved
	repl   *pgconn.Config
	pool   *pgxpool.Pool
	stream *logstream.Stream // the session's

	mu     sync.Mutex
	status SlotStatus // latest Lag read
}

// New returns a log-mode relay on the slot. store is the outbox table's
// store (the retry path's core.Relay claims from it); pub receives the
// events. Run returns an error wrapping ErrNoSlot or ErrSlotInvalidated
// when the slot cannot be streamed at all.
func New(store core.Store, pub core.Publisher, opts Options) (*logmode.Relay, error) {
	if store == nil || pub == nil {
		return nil, fmt.Errorf("%w: logrelay.New needs a store and a publisher", core.ErrInvalidOptions)
	}
	names, err := opts.Names.resolve()
	if err != nil {
		return nil, err
	}
	if opts.ConnString == "" {
		return nil, fmt.Errorf("%w: logrelay: Options.ConnString is required", core.ErrInvalidOptions)
	}
	if opts.ServerTimeout < 0 || opts.ConfirmInterval < 0 {
		return nil, fmt.Errorf("%w: logrelay: negative ServerTimeout or ConfirmInterval", core.ErrInvalidOptions)
	}
	if opts.ServerTimeout == 0 {
		opts.ServerTimeout = 10 * time.Second
	}
	pcfg, err := pgxpool.ParseConfig(opts.ConnString)
	if err != nil {
		return nil, fmt.Errorf("%w: logrelay: ConnString: %w", core.ErrInvalidOptions, err)
	}
	// The replication connection takes the DSN without the settings of
	// pgx and pgxpool (default_query_exec_mode, pool_max_conns, ...),
	// which pgx's own parsers remove: sent as startup parameters, the
	// server would refuse them.
	repl := pcfg.ConnConfig.Config.Copy()
	repl.RuntimeParams["replication"] = "database"
	repl.RuntimeParams["wal_sender_timeout"] = strconv.FormatInt(opts.ServerTimeout.Milliseconds(), 10)
	if repl.RuntimeParams["application_name"] == "" {
		repl.RuntimeParams["application_name"] = "txoutbox-log-relay"
	}
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		return nil, fmt.Errorf("logrelay: %w", err)
	}
	src := &source{opts: opts, names: names, repl: repl, pool: pool}
	r, err := logmode.New(store, pub, src, opts.Options)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return r, nil
}

// Describe names the slot, for the log lines.
func (r *source) Describe() (key, name string) { return "slot", r.names.slot }

// Table is the outbox table of the retry path.
func (r *source) Table(ropts core.RelayOptions) logstream.Table {
	return newPGTable(r.pool, r.names, ropts)
}

// Session streams the slot once.
func (r *source) Session(ctx context.Context, s *logstream.Stream, started func()) error {
	r.stream = s // every goroutine of the last session has ended
	return r.session(ctx, started)
}

// Classify judges the error that ended a session.
func (r *source) Classify(err error) (logstream.Verdict, string) { return classify(err) }

// Lag is the age of the slot's confirmed position.
func (r *source) Lag(ctx context.Context) (time.Duration, error) {
	st, err := readStatus(ctx, r.pool, r.names)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	r.status = st
	r.mu.Unlock()
	return st.ConfirmedAge, nil
}

// LastSlotStatus is the slot's state as r's latest Stats read it; ok is
// false when r does not stream a PostgreSQL slot.
func LastSlotStatus(r *logmode.Relay) (st SlotStatus, ok bool) {
	src, ok := r.Source().(*source)
	if !ok {
		return SlotStatus{}, false
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	return src.status, true
}

// Close closes the pool.
func (r *source) Close() { r.pool.Close() }
