// Package logmode is the relay of log mode, whatever the database: it
// streams the outbox's events from the database's log to the broker, with
// no write per event, and hands the events the broker refuses to the
// outbox table, where a core.Relay that runs alongside retries them with
// the table mode's attempts, backoff and dead letters.
//
// The log is a Source: PostgreSQL's logical replication slot (package
// logrelay) or MySQL's and MariaDB's binlog (package binlogrelay). Their New
// functions return a *Relay; everything else about a running relay (its
// options, counters, health and stats) is this package's, the same on
// every database. Several relays may run on one log: one streams, the
// others stand by and take over when it stops.
//
// Delivery is at least once: a relay killed after a publish and before it
// confirmed the position sends the batch again when it, or another relay,
// streams next. With a publisher that stores positions
// (core.PositionPublisher, such as kafkabroker's transactional publisher),
// each batch is published together with the position it ends at, and a
// relay that starts skips what the broker already has: consumers that read
// only committed writes see each event once.
package logmode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/logstream"
)

// Options are what every log-mode relay takes, whatever its database.
// Zero fields take their defaults.
type Options struct {
	// Relay configures the table relay that runs alongside the stream for
	// the retry path, and the stream itself: BatchSize (events per
	// publish), PublishTimeout, Retry (the backoff of the first failure
	// and whether it is already the last), MaxErrorLength, Ordering,
	// Ordered.DeadLetter and Logger.
	Relay core.RelayOptions
	// StandbyInterval is how often a relay whose log another relay
	// streams tries to take it over. Default 1s.
	StandbyInterval time.Duration
	// SpillAfter is how long, in ordered mode, the events of an aggregate
	// whose earlier event is in the table's retry path wait in memory for
	// the table to publish it, before they are written to the table behind
	// it. It bounds how long the confirmed position waits for them.
	// Default 1s.
	SpillAfter time.Duration
	// HoldOnBrokerDown is how long the stream retries, with backoff, a
	// batch of which the broker took no event (down, or reconnecting),
	// before it hands the batch to the table's retry path: a broker
	// restart of a few seconds then writes nothing to the table, and no
	// event waits out a table backoff once the broker is back. The
	// position is not confirmed meanwhile. Default
	// DefaultHoldOnBrokerDown; negative: hand a failed batch over at once.
	HoldOnBrokerDown time.Duration
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
	// Confirms counts confirmed positions stored or sent to the server.
	Confirms int64
	// Streams counts the times this relay started streaming: the first
	// start, reconnections and takeovers from another relay.
	Streams int64
	// Skipped counts events the log sent again that the broker already
	// had, with the position stored with them (a publisher with
	// PublisherCapabilities.StoresPositions): they are not sent again.
	Skipped int64
}

// Source is a database's log as a Relay reads it: how to stream it once,
// where the events the broker refused go, and what an error that ended a
// session means. Packages logrelay and binlogrelay implement it; its
// methods name this module's internal types, so no other package can.
type Source interface {
	// Describe names what is streamed, for the log lines: ("slot",
	// "txoutbox") or ("stream", "txoutbox").
	Describe() (key, name string)
	// Table is the outbox table as the stream writes failed and held
	// events to it; ropts are the retry path's options.
	Table(ropts core.RelayOptions) logstream.Table
	// Session streams once, from connecting to the first error: it starts
	// at the stored position (s.Started, then started), decodes what it
	// reads into s.Received, publishes through s.Publish and stores the
	// positions s confirms.
	Session(ctx context.Context, s *logstream.Stream, started func()) error
	// Classify judges the error that ended a session; detail, if not
	// empty, is logged with a Standby.
	Classify(err error) (v logstream.Verdict, detail string)
	// Lag reads the log's state and says how old the stored position is:
	// what the log holds past it is at least that old, even while no
	// relay streams. Stats calls it.
	Lag(ctx context.Context) (time.Duration, error)
	// Close releases the source's connections once Run has returned.
	Close()
}

// Relay streams the outbox's events from a Source to the broker (log mode).
type Relay struct {
	opts   Options
	src    Source
	table  *core.Relay
	store  core.Store
	stream *logstream.Stream
}

// New returns a log-mode relay on src. store is the outbox table's store
// (the retry path's core.Relay claims from it); pub receives the events.
// Packages logrelay and binlogrelay call it with their Source.
func New(store core.Store, pub core.Publisher, src Source, opts Options) (*Relay, error) {
	if store == nil || pub == nil || src == nil {
		return nil, fmt.Errorf("%w: logmode.New needs a store, a publisher and a source", core.ErrInvalidOptions)
	}
	if opts.StandbyInterval < 0 || opts.SpillAfter < 0 {
		return nil, fmt.Errorf("%w: logmode: negative StandbyInterval or SpillAfter", core.ErrInvalidOptions)
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
	var positions core.PositionPublisher
	if pub.Capabilities().StoresPositions {
		var ok bool
		if positions, ok = core.PublisherAs[core.PositionPublisher](pub); !ok {
			return nil, fmt.Errorf("%w: logmode: the publisher reports StoresPositions but neither it nor a publisher it wraps (core.PublisherWrapper) is a core.PositionPublisher", core.ErrInvalidOptions)
		}
	}
	table, err := core.NewRelay(store, pub, opts.Relay)
	if err != nil {
		return nil, err
	}
	r := &Relay{opts: opts, src: src, table: table, store: store}
	r.stream = logstream.New(logstream.Options{Table: src.Table(table.Options()), Relay: table, Publisher: pub,
		SpillAfter: opts.SpillAfter, HoldOnBrokerDown: opts.HoldOnBrokerDown, Positions: positions})
	return r, nil
}

// Source returns the log the relay reads, for its database's own reports
// (logrelay.LastSlotStatus, binlogrelay.LastStatus).
func (r *Relay) Source() Source { return r.src }

// Ordered reports whether the relay keeps per-aggregate order.
func (r *Relay) Ordered() bool { return r.stream.Ordered() }

// Table returns the relay of the retry path.
func (r *Relay) Table() *core.Relay { return r.table }

// Streaming reports whether this relay streams the log now (false while
// it stands by or reconnects).
func (r *Relay) Streaming() bool { return r.stream.Streaming() }

// Counters returns the relay's totals.
func (r *Relay) Counters() Counters {
	sc := r.stream.Counters()
	return Counters{
		Published: sc.Published, Failed: sc.Failed, Held: sc.Held, TableWrites: sc.Failed + sc.Held,
		Confirms: sc.Confirms, Streams: sc.Streams, Skipped: sc.Skipped,
	}
}

// Health is the relay's view of its dependencies: the stream's and the
// retry path's.
func (r *Relay) Health() core.RelayHealth { return r.stream.Health() }

// Stats reports the outbox in log mode: pending is the retry path's rows
// plus the events this relay read and has not handled, and the oldest
// pending age is the oldest of those and of the stored position.
func (r *Relay) Stats(ctx context.Context) (core.Stats, error) {
	var s core.Stats
	if sr, ok := r.store.(core.StatsReader); ok {
		var err error
		if s, err = sr.Stats(ctx); err != nil {
			return s, err
		}
	}
	lag, err := r.src.Lag(ctx)
	if err != nil {
		return s, err
	}
	n, oldest := r.stream.Pending()
	s.Pending += n
	if !oldest.IsZero() {
		if age := time.Since(oldest); age > s.OldestPendingAge {
			s.OldestPendingAge = age
			s.OldestPending = oldest
		}
	}
	// With no relay streaming, nothing measures what waits past the
	// stored position but its age.
	if lag > s.OldestPendingAge {
		s.OldestPendingAge = lag
	}
	return s, nil
}

// Run streams until ctx ends, and runs the retry path's table relay
// alongside. It returns nil when ctx ends, and the Source's error when
// the log cannot be streamed at all (logrelay.ErrNoSlot,
// binlogrelay.ErrBinlogPurged, ...); any other failure (connection lost,
// server restarted, broker down) is retried.
func (r *Relay) Run(ctx context.Context) error {
	defer r.src.Close()
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
	key, name := r.src.Describe()
	err := r.stream.Loop(ctx, logstream.LoopOptions{Key: key, Name: name, StandbyInterval: r.opts.StandbyInterval,
		Session:  func(ctx context.Context, started func()) error { return r.src.Session(ctx, r.stream, started) },
		Classify: r.src.Classify})
	cancel()
	wg.Wait()
	return errors.Join(err, tableErr)
}
