package binlogrelay

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/logstream"
)

// Options configures a Relay. Zero fields take their defaults.
type Options struct {
	// DSN is the outbox database's, as github.com/go-sql-driver/mysql
	// takes it (user:password@tcp(host:port)/dbname). The relay reads the
	// binlog with the same address and user, and keeps a small pool for
	// the position and the retry path. Required.
	DSN string
	// Names are the table and the stream (Setup created them).
	Names
	// Relay configures the table relay that runs alongside the stream for
	// the retry path, and the stream itself: BatchSize (events per
	// publish), PublishTimeout, Retry, MaxErrorLength, Ordering,
	// Ordered.DeadLetter and Logger.
	Relay core.RelayOptions
	// StandbyInterval is how often a relay whose stream another relay
	// holds tries to take it over. Default 1s.
	StandbyInterval time.Duration
	// SpillAfter is how long, in ordered mode, the events of an aggregate
	// whose earlier event is in the table's retry path wait in memory
	// before they are written to the table behind it. Default 1s.
	SpillAfter time.Duration
	// HoldOnBrokerDown is how long the stream retries, with backoff, a
	// batch of which the broker took no event (down, or reconnecting),
	// before it hands the batch to the table's retry path: a broker
	// restart of a few seconds then writes nothing to the table, and no
	// event waits out a table backoff once the broker is back. The
	// position is not confirmed meanwhile. Default 5s; negative: hand a
	// failed batch over at once.
	HoldOnBrokerDown time.Duration
	// ConfirmInterval is how often, at most, the stream stores its
	// position while events flow: what a relay killed at any moment sends
	// again is what it published in the last interval and the batch in
	// flight. Default 20ms: 50 small commits a second at most, whatever
	// the event rate.
	// Without events (other tables' writes only) the position is stored
	// at most once a second.
	ConfirmInterval time.Duration
	// ServerID is the replica server id the relay reads the binlog as; it
	// must differ from the server's and its replicas'. Default: a random
	// id per session, above 2^30.
	ServerID uint32
}

// DefaultHoldOnBrokerDown is Options.HoldOnBrokerDown's default.
const DefaultHoldOnBrokerDown = logstream.DefaultHoldOnBrokerDown

// Counters are a Relay's totals since it started.
type Counters struct {
	// Published counts events the broker accepted from the stream.
	Published int64
	// Failed counts events whose publish from the stream failed; each was
	// handed to the table's retry path.
	Failed int64
	// Held counts events handed to the table because an earlier event of
	// their aggregate was there (ordered mode).
	Held int64
	// TableWrites counts rows the relay handed to the table: Failed +
	// Held. It stays 0 while every publish succeeds.
	TableWrites int64
	// Confirms counts positions stored.
	Confirms int64
	// Streams counts the times this relay started streaming (the first
	// start, reconnections, takeovers).
	Streams int64
}

// Relay streams the outbox's events from the binlog to the broker (log
// mode on MySQL and MariaDB). Events whose publish fails go to the outbox
// table, where a core.Relay that runs alongside retries them. Several
// Relays may run on one stream: one streams, the others stand by.
type Relay struct {
	opts   Options
	names  resolved
	cfg    *mysql.Config
	db     *sql.DB
	table  *core.Relay
	store  core.Store
	stream *logstream.Stream
	// purged is set when the stored position's binlog is gone.
	purged atomic.Bool

	mu     sync.Mutex
	status Status // latest Stats read
}

// New returns a log-mode relay. store is the outbox table's store (the
// retry path's core.Relay claims from it); pub receives the events.
func New(store core.Store, pub core.Publisher, opts Options) (*Relay, error) {
	if store == nil || pub == nil {
		return nil, fmt.Errorf("%w: binlogrelay.New needs a store and a publisher", core.ErrInvalidOptions)
	}
	names, err := opts.Names.resolve()
	if err != nil {
		return nil, err
	}
	if opts.DSN == "" {
		return nil, fmt.Errorf("%w: binlogrelay: Options.DSN is required", core.ErrInvalidOptions)
	}
	if opts.StandbyInterval < 0 || opts.SpillAfter < 0 || opts.ConfirmInterval < 0 {
		return nil, fmt.Errorf("%w: binlogrelay: negative StandbyInterval, SpillAfter or ConfirmInterval", core.ErrInvalidOptions)
	}
	if opts.StandbyInterval == 0 {
		opts.StandbyInterval = time.Second
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
	if opts.ConfirmInterval == 0 {
		opts.ConfirmInterval = 20 * time.Millisecond
	}
	table, err := core.NewRelay(store, pub, opts.Relay)
	if err != nil {
		return nil, err
	}
	db, cfg, err := open(opts.DSN)
	if err != nil {
		return nil, err
	}
	if cfg.Net != "tcp" {
		db.Close()
		return nil, fmt.Errorf("%w: binlogrelay: the DSN must reach the server over TCP (a replica connection), not %s", core.ErrInvalidOptions, cfg.Net)
	}
	// The lock's connection, the position's writes and the retry path.
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	r := &Relay{opts: opts, names: names, cfg: cfg, db: db, table: table, store: store}
	r.stream = logstream.New(logstream.Options{Table: newTable(db, names, table.Options()), Relay: table, Publisher: pub,
		SpillAfter: opts.SpillAfter, HoldOnBrokerDown: opts.HoldOnBrokerDown})
	return r, nil
}

// Ordered reports whether the relay keeps per-aggregate order.
func (r *Relay) Ordered() bool { return r.stream.Ordered() }

// Table returns the relay of the retry path.
func (r *Relay) Table() *core.Relay { return r.table }

// Streaming reports whether this relay streams now (false while it stands
// by or reconnects).
func (r *Relay) Streaming() bool { return r.stream.Streaming() }

// BinlogPurged reports whether the relay stopped because the binlog file
// of its position is gone (see Recover).
func (r *Relay) BinlogPurged() bool { return r.purged.Load() }

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
// plus the events this relay read and has not handled, and the oldest
// pending age is the older of the two. The stream's state is read too
// (LastStatus).
func (r *Relay) Stats(ctx context.Context) (core.Stats, error) {
	var s core.Stats
	if sr, ok := r.store.(core.StatsReader); ok {
		var err error
		if s, err = sr.Stats(ctx); err != nil {
			return s, err
		}
	}
	st, err := ReadStatus(ctx, r.db, r.opts.Names)
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
	// With no relay streaming, what the binlog holds past the position
	// is at least as old as the position's last store.
	if st.Lag > s.OldestPendingAge {
		s.OldestPendingAge = st.Lag
	}
	return s, nil
}

// LastStatus is the stream's state as the latest Stats read it.
func (r *Relay) LastStatus() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// Run streams until ctx ends, and runs the retry path's table relay
// alongside. It returns nil when ctx ends, and an error wrapping
// ErrNotSetUp or ErrBinlogPurged when the stream cannot resume at all; any
// other failure (connection lost, server restarted, broker down) is
// retried.
func (r *Relay) Run(ctx context.Context) error {
	defer r.db.Close()
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
	err := r.stream.Loop(ctx, logstream.LoopOptions{Key: "stream", Name: r.names.name, StandbyInterval: r.opts.StandbyInterval,
		Session: r.session, Classify: r.classify})
	cancel()
	wg.Wait()
	return errors.Join(err, tableErr)
}

// errStandby ends a session whose lock another relay holds.
var errStandby = errors.New("binlogrelay: another relay holds the stream's lock")

func (r *Relay) classify(err error) (logstream.Verdict, string) {
	switch {
	case errors.Is(err, ErrNotSetUp), errors.Is(err, core.ErrNotMigrated):
		return logstream.Fatal, ""
	case errors.Is(err, ErrBinlogPurged):
		r.purged.Store(true)
		return logstream.Fatal, ""
	case errors.Is(err, errStandby):
		return logstream.Standby, err.Error()
	}
	return logstream.Lost, ""
}

// randomServerID is a replica server id for one session, above 2^30 where
// servers' own ids seldom are.
func randomServerID() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return 1<<30 | binary.LittleEndian.Uint32(b[:])>>2
}

// isMariaDB tells the binlog's flavour from the server's version.
func isMariaDB(ctx context.Context, db *sql.DB) (bool, error) {
	var v string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
		return false, err
	}
	return strings.Contains(strings.ToLower(v), "mariadb"), nil
}
