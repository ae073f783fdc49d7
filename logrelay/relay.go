package logrelay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/logstream"
)

// Options configures a Relay. Zero fields take their defaults.
type Options struct {
	// ConnString is the PostgreSQL connection string (URL or key=value)
	// of the outbox's database. The relay opens a replication connection
	// with it for the stream, and a small pool for the retry path.
	// Required.
	ConnString string
	// Names are the table, slot and publication (Setup created them).
	Names
	// Relay configures the table relay that runs alongside the stream for
	// the retry path, and the stream itself: BatchSize (events per
	// publish), PublishTimeout, Retry (the backoff of the first failure
	// and whether it is already the last), MaxErrorLength, Ordering,
	// Ordered.DeadLetter and Logger.
	Relay core.RelayOptions
	// StandbyInterval is how often a relay whose slot another relay
	// streams tries to take it over. Default 1s.
	StandbyInterval time.Duration
	// SpillAfter is how long, in ordered mode, the events of an aggregate
	// whose earlier event is in the table's retry path wait in memory for
	// the table to publish it, before they are written to the table behind
	// it. It bounds how long the slot's confirmed position waits for them.
	// Default 1s.
	SpillAfter time.Duration
	// HoldOnBrokerDown is how long the stream retries, with backoff, a
	// batch of which the broker took no event (down, or reconnecting),
	// before it hands the batch to the table's retry path: a broker
	// restart of a few seconds then writes nothing to the table, and no
	// event waits out a table backoff once the broker is back. The
	// position is not confirmed meanwhile. Default 5s; negative: hand a
	// failed batch over at once.
	HoldOnBrokerDown time.Duration
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

// DefaultHoldOnBrokerDown is Options.HoldOnBrokerDown's default.
const DefaultHoldOnBrokerDown = logstream.DefaultHoldOnBrokerDown

// Counters are a Relay's totals since it started.
type Counters struct {
	// Published counts events the broker accepted from the stream.
	Published int64
	// Failed counts events whose publish from the stream failed; each
	// was handed to the table's retry path.
	Failed int64
	// Held counts events written to the table, unpublished, because an
	// earlier event of their aggregate was there (ordered mode).
	Held int64
	// TableWrites counts rows the relay wrote to the table: Failed + Held.
	// It stays 0 while every publish succeeds.
	TableWrites int64
	// Confirms counts confirmed positions sent to the server.
	Confirms int64
	// Streams counts the times this relay started streaming the slot:
	// the first start, reconnections and takeovers from another relay.
	Streams int64
}

// Relay streams the outbox's events from a logical replication slot to the
// broker (log mode): no write per event, progress is the slot's confirmed
// position. Events whose publish fails go to the outbox table, where a
// core.Relay that runs alongside retries them with the table mode's
// attempts, backoff and dead letters. Several Relays may run on one slot:
// one streams, the others stand by and take over when it stops.
type Relay struct {
	opts   Options
	names  resolved
	repl   *pgconn.Config
	pool   *pgxpool.Pool
	table  *core.Relay
	store  core.Store
	stream *logstream.Stream

	mu     sync.Mutex
	status SlotStatus // latest Stats read
}

// New returns a log-mode relay. store is the outbox table's store (the
// retry path's core.Relay claims from it); pub receives the events.
func New(store core.Store, pub core.Publisher, opts Options) (*Relay, error) {
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
	if opts.StandbyInterval < 0 || opts.ServerTimeout < 0 || opts.SpillAfter < 0 || opts.ConfirmInterval < 0 {
		return nil, fmt.Errorf("%w: logrelay: negative StandbyInterval, ServerTimeout, SpillAfter or ConfirmInterval", core.ErrInvalidOptions)
	}
	if opts.SpillAfter == 0 {
		opts.SpillAfter = time.Second
	}
	switch {
	case opts.HoldOnBrokerDown == 0:
		opts.HoldOnBrokerDown = DefaultHoldOnBrokerDown
	case opts.HoldOnBrokerDown < 0:
		opts.HoldOnBrokerDown = 0
	}
	if opts.StandbyInterval == 0 {
		opts.StandbyInterval = time.Second
	}
	if opts.ServerTimeout == 0 {
		opts.ServerTimeout = 10 * time.Second
	}
	table, err := core.NewRelay(store, pub, opts.Relay)
	if err != nil {
		return nil, err
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
	r := &Relay{opts: opts, names: names, repl: repl, pool: pool, table: table, store: store}
	r.stream = logstream.New(logstream.Options{Table: newPGTable(pool, names, table.Options()), Relay: table, Publisher: pub,
		SpillAfter: opts.SpillAfter, HoldOnBrokerDown: opts.HoldOnBrokerDown})
	return r, nil
}

// Ordered reports whether the relay keeps per-aggregate order.
func (r *Relay) Ordered() bool { return r.stream.Ordered() }

// Table returns the relay of the retry path.
func (r *Relay) Table() *core.Relay { return r.table }

// Streaming reports whether this relay streams the slot now (false while
// it stands by or reconnects).
func (r *Relay) Streaming() bool { return r.stream.Streaming() }

// Counters returns the relay's totals.
func (r *Relay) Counters() Counters {
	sc := r.stream.Counters()
	return Counters{
		Published: sc.Published, Failed: sc.Failed, Held: sc.Held, TableWrites: sc.Failed + sc.Held,
		Confirms: sc.Confirms, Streams: sc.Streams,
	}
}

// Health is the relay's view of its dependencies: the stream's and the
// retry path's.
func (r *Relay) Health() core.RelayHealth { return r.stream.Health() }

// Stats reports the outbox in log mode: pending is the retry path's rows
// plus the events this relay received and has not confirmed, and the
// oldest pending age is the older of the two. The slot's state is read
// too (LastSlotStatus).
func (r *Relay) Stats(ctx context.Context) (core.Stats, error) {
	var s core.Stats
	if sr, ok := r.store.(core.StatsReader); ok {
		var err error
		if s, err = sr.Stats(ctx); err != nil {
			return s, err
		}
	}
	st, err := readStatus(ctx, r.pool, r.names)
	if err != nil {
		return s, err
	}
	r.mu.Lock()
	r.status = st
	r.mu.Unlock()
	n, oldest := r.stream.Pending()
	s.Pending += n
	if !oldest.IsZero() {
		if age := time.Since(oldest); age > s.OldestPendingAge {
			s.OldestPendingAge = age
			s.OldestPending = oldest
		}
	}
	// With no relay streaming, the walsender cannot measure the age of
	// the confirmed position: what is unconfirmed is at least as old as
	// this process's view of it.
	if st.ConfirmedAge > s.OldestPendingAge {
		s.OldestPendingAge = st.ConfirmedAge
	}
	return s, nil
}

// LastSlotStatus is the slot's state as the latest Stats read it.
func (r *Relay) LastSlotStatus() SlotStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// Run streams until ctx ends, and runs the retry path's table relay
// alongside. It returns nil when ctx ends, and an error wrapping ErrNoSlot
// or ErrSlotInvalidated when the slot cannot be streamed at all; any other
// failure (connection lost, server restarted, broker down) is retried.
func (r *Relay) Run(ctx context.Context) error {
	defer r.pool.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var tableErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		if tableErr = r.table.Run(ctx); tableErr != nil {
			cancel()
		}
	}()
	err := r.stream.Loop(ctx, logstream.LoopOptions{Key: "slot", Name: r.names.slot, StandbyInterval: r.opts.StandbyInterval,
		Session: r.session, Classify: classify})
	cancel()
	wg.Wait()
	return errors.Join(err, tableErr)
}
