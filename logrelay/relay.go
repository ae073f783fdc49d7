package logrelay

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/txoutbox/core"
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
	// ServerTimeout is how long the server may stay silent before the
	// relay drops the connection and reconnects; the relay asks for a
	// reply every second. It is also passed to the server as
	// wal_sender_timeout, so that the server frees the slot for a standby
	// this long after the streaming relay stopped answering. Default 10s.
	ServerTimeout time.Duration
}

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
	pub    core.Publisher
	log    *slog.Logger
	ropts  core.RelayOptions
	order  bool
	insert string
	heldQ  string

	confirmed atomic.Uint64 // LSN every event before which is handled
	// oldest is the commit time (unix nanos) of the oldest event received
	// and not yet confirmed; 0 when none.
	oldest     atomic.Int64
	inflight   atomic.Int64
	streaming  atomic.Bool
	brokerDown atomic.Bool
	// tableAtDown is what the table relay had published when the stream
	// found the broker down (brokerBackViaTable).
	tableAtDown atomic.Int64
	storeDown   atomic.Bool
	c           struct{ published, failed, held, confirms, streams atomic.Int64 }

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
	if opts.StandbyInterval < 0 || opts.ServerTimeout < 0 || opts.SpillAfter < 0 {
		return nil, fmt.Errorf("%w: logrelay: negative StandbyInterval, ServerTimeout or SpillAfter", core.ErrInvalidOptions)
	}
	if opts.SpillAfter == 0 {
		opts.SpillAfter = time.Second
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
	repl, err := pgconn.ParseConfig(opts.ConnString)
	if err != nil {
		return nil, fmt.Errorf("%w: logrelay: ConnString: %w", core.ErrInvalidOptions, err)
	}
	repl.RuntimeParams["replication"] = "database"
	repl.RuntimeParams["wal_sender_timeout"] = strconv.FormatInt(opts.ServerTimeout.Milliseconds(), 10)
	if repl.RuntimeParams["application_name"] == "" {
		repl.RuntimeParams["application_name"] = "txoutbox-log-relay"
	}
	pcfg, err := pgxpool.ParseConfig(opts.ConnString)
	if err != nil {
		return nil, fmt.Errorf("%w: logrelay: ConnString: %w", core.ErrInvalidOptions, err)
	}
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		return nil, fmt.Errorf("logrelay: %w", err)
	}
	ropts := table.Options()
	r := &Relay{
		opts: opts, names: names, repl: repl, pool: pool, table: table, store: store, pub: pub,
		log: ropts.Logger, ropts: ropts, order: table.Ordered(),
		insert: `INSERT INTO ` + names.quotedTable + ` (id, event_id, aggregate_type, aggregate_id, event_type, payload, headers,
			created_at, attempt_count, last_error, next_attempt_at, dead_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now() + $11 * interval '1 microsecond', CASE WHEN $12 THEN now() END)
			ON CONFLICT (id) DO NOTHING`,
	}
	r.heldQ = `SELECT DISTINCT aggregate_id FROM ` + names.quotedTable + ` WHERE published_at IS NULL AND aggregate_id <> ''`
	if ropts.Ordered.DeadLetter == core.DeadLetterSkip {
		r.heldQ += ` AND dead_at IS NULL`
	}
	return r, nil
}

// Ordered reports whether the relay keeps per-aggregate order.
func (r *Relay) Ordered() bool { return r.order }

// Table returns the relay of the retry path.
func (r *Relay) Table() *core.Relay { return r.table }

// Streaming reports whether this relay streams the slot now (false while
// it stands by or reconnects).
func (r *Relay) Streaming() bool { return r.streaming.Load() }

// Counters returns the relay's totals.
func (r *Relay) Counters() Counters {
	c := Counters{
		Published: r.c.published.Load(), Failed: r.c.failed.Load(), Held: r.c.held.Load(),
		Confirms: r.c.confirms.Load(), Streams: r.c.streams.Load(),
	}
	c.TableWrites = c.Failed + c.Held
	return c
}

// Health is the relay's view of its dependencies: the stream's and the
// retry path's.
func (r *Relay) Health() core.RelayHealth {
	h := r.table.Health()
	h.BrokerDown = h.BrokerDown || r.brokerDown.Load()
	h.StoreDown = h.StoreDown || r.storeDown.Load()
	return h
}

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
	if n := r.inflight.Load(); n > 0 {
		s.Pending += n
	}
	if o := r.oldest.Load(); o != 0 {
		if age := time.Since(time.Unix(0, o)); age > s.OldestPendingAge {
			s.OldestPendingAge = age
			s.OldestPending = time.Unix(0, o)
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
	err := r.stream(ctx)
	cancel()
	wg.Wait()
	return errors.Join(err, tableErr)
}

// stream keeps one streaming session going, standing by while another
// relay holds the slot.
func (r *Relay) stream(ctx context.Context) error {
	var (
		standing bool
		lost     time.Time
		wait     = 100 * time.Millisecond
	)
	for {
		err := r.session(ctx, func() {
			if standing {
				r.log.Info("txoutbox: log: took the slot over; streaming", "slot", r.names.slot)
			} else if !lost.IsZero() {
				r.log.Info("txoutbox: log: streaming again", "slot", r.names.slot, "after", time.Since(lost).Round(time.Millisecond))
			} else {
				r.log.Info("txoutbox: log: streaming", "slot", r.names.slot, "ordered", r.order)
			}
			standing, lost, wait = false, time.Time{}, 100*time.Millisecond
			r.storeDown.Store(false)
		})
		r.streaming.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		var pgErr *pgconn.PgError
		switch {
		case errors.Is(err, ErrNoSlot), errors.Is(err, ErrSlotInvalidated):
			r.log.Error("txoutbox: log: cannot stream", "slot", r.names.slot, "error", err)
			return err
		case errors.As(err, &pgErr) && pgErr.Code == "55006": // slot in use
			if !standing {
				r.log.Info("txoutbox: log: another relay streams the slot; standing by", "slot", r.names.slot, "detail", pgErr.Message)
				standing = true
			}
			if !sleep(ctx, r.opts.StandbyInterval) {
				return nil
			}
			continue
		}
		if lost.IsZero() {
			lost = time.Now()
			r.storeDown.Store(true)
			r.log.Warn("txoutbox: log: stream lost; reconnecting with backoff (logged once until it streams again)", "slot", r.names.slot, "error", err)
		} else {
			r.log.Debug("txoutbox: log: reconnect failed", "error", err)
		}
		if !sleep(ctx, wait) {
			return nil
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// item is what the receiver hands the publisher: the events of one
// committed transaction (or none, for a keepalive), and the position to
// confirm once they are handled.
type item struct {
	events []core.Event
	end    pglogrepl.LSN
	commit time.Time
}

// session streams once: from connecting to the first error.
func (r *Relay) session(ctx context.Context, started func()) error {
	var start pglogrepl.LSN
	var walStatus string
	err := r.pool.QueryRow(ctx, "SELECT confirmed_flush_lsn::text, coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1", r.names.slot).
		Scan(&start, &walStatus)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %s (create it with txoutbox log create)", ErrNoSlot, r.names.slot)
	}
	if err != nil {
		return err
	}
	if walStatus == "lost" {
		return fmt.Errorf("%w: slot %s (wal_status lost): events written while it fell behind may be missing", ErrSlotInvalidated, r.names.slot)
	}
	conn, err := pgconn.ConnectConfig(ctx, r.repl)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	err = pglogrepl.StartReplication(ctx, conn, r.names.slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + r.names.pub + "'", "messages 'true'"},
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55000" {
			return fmt.Errorf("%w: %s", ErrSlotInvalidated, pgErr.Message)
		}
		if errors.As(err, &pgErr) && pgErr.Code == "42704" {
			return fmt.Errorf("%w: %s", ErrNoSlot, pgErr.Message)
		}
		return err
	}
	r.confirmed.Store(uint64(start))
	r.streaming.Store(true)
	r.c.streams.Add(1)
	started()

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	items := make(chan item, 256)
	var wg sync.WaitGroup
	var pubErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		if pubErr = r.publishLoop(sctx, items); pubErr != nil {
			cancel()
		}
	}()
	recvErr := r.receive(sctx, conn, items)
	cancel()
	wg.Wait()
	r.inflight.Store(0)
	r.oldest.Store(0)
	if pubErr != nil {
		return pubErr
	}
	return recvErr
}

// receive reads the stream, decodes the outbox's messages into items, and
// reports the confirmed position to the server.
func (r *Relay) receive(ctx context.Context, conn *pgconn.PgConn, out chan<- item) error {
	var (
		cur        *item // the transaction being read
		sent       = r.confirmed.Load()
		lastServer = time.Now()
		nextStatus time.Time
	)
	status := func(ask bool) error {
		pos := r.confirmed.Load()
		if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: pglogrepl.LSN(pos), ReplyRequested: ask,
		}); err != nil {
			return err
		}
		if pos != sent {
			r.c.confirms.Add(1)
		}
		sent = pos
		return nil
	}
	// push hands it to the publisher; the server keeps hearing from the
	// relay while the publisher is busy.
	push := func(it item) error {
		for {
			select {
			case out <- it:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
				if err := status(false); err != nil {
					return err
				}
			}
		}
	}
	for {
		now := time.Now()
		if now.After(nextStatus) || r.confirmed.Load() != sent {
			ask := now.After(nextStatus)
			if err := status(ask); err != nil {
				return err
			}
			if ask {
				nextStatus = now.Add(time.Second)
			}
		}
		if now.Sub(lastServer) > r.opts.ServerTimeout {
			return fmt.Errorf("logrelay: the server sent nothing for %s", now.Sub(lastServer).Round(time.Millisecond))
		}
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Millisecond)
		msg, err := conn.ReceiveMessage(rctx)
		rcancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				continue
			}
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		case *pgproto3.CopyData:
			lastServer = time.Now()
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return err
				}
				if ka.ReplyRequested {
					if err := status(false); err != nil {
						return err
					}
				}
				// Between transactions everything before the server's
				// position was sent: confirm it once what came before is
				// handled, so that an idle outbox does not hold WAL back.
				if cur == nil {
					if err := push(item{end: ka.ServerWALEnd}); err != nil {
						return err
					}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return err
				}
				lm, err := pglogrepl.Parse(xld.WALData)
				if err != nil {
					continue // a message kind log mode has no use for
				}
				switch v := lm.(type) {
				case *pglogrepl.BeginMessage:
					cur = &item{commit: v.CommitTime}
				case *pglogrepl.LogicalDecodingMessage:
					if cur == nil || !v.Transactional || v.Prefix != r.names.prefix {
						continue
					}
					ev, err := decodeEvent(v.Content)
					if err != nil {
						// A row the trigger wrote cannot fail to decode;
						// stopping here keeps it in the slot for a fix.
						return fmt.Errorf("logrelay: decode event at %s: %w", v.LSN, err)
					}
					cur.events = append(cur.events, ev)
				case *pglogrepl.CommitMessage:
					if cur == nil {
						continue
					}
					it := *cur
					cur = nil
					it.end = v.TransactionEndLSN
					if len(it.events) > 0 {
						r.inflight.Add(int64(len(it.events)))
						r.oldest.CompareAndSwap(0, it.commit.UnixNano())
					}
					if err := push(it); err != nil {
						return err
					}
				}
			}
		}
	}
}

// header is the first line of a message: the event's fields but its
// payload (see messagePrefix).
type header struct {
	ID            int64             `json:"id"`
	EventID       string            `json:"event_id"`
	AggregateType string            `json:"aggregate_type"`
	AggregateID   string            `json:"aggregate_id"`
	EventType     string            `json:"event_type"`
	Headers       map[string]string `json:"headers"`
	CreatedAt     time.Time         `json:"created_at"`
}

func decodeEvent(b []byte) (core.Event, error) {
	line, payload, ok := bytes.Cut(b, []byte{'\n'})
	if !ok {
		return core.Event{}, errors.New("no newline between the header and the payload")
	}
	var h header
	if err := json.Unmarshal(line, &h); err != nil {
		return core.Event{}, err
	}
	return core.Event{
		Seq: h.ID, ID: h.EventID, AggregateType: h.AggregateType, AggregateID: h.AggregateID,
		EventType: h.EventType, Payload: bytes.Clone(payload), Headers: h.Headers,
		CreatedAt: h.CreatedAt, NextAttemptAt: h.CreatedAt,
	}, nil
}

// waiting is an aggregate's events that arrived while an earlier event of
// it was in the table's retry path (ordered mode). They wait in memory for
// the table to publish it, so that the aggregate returns to the stream as
// soon as it did; after SpillAfter they are written to the table behind it
// instead, so that the confirmed position never waits longer than that.
type waiting struct {
	events  []core.Event
	blockAt []pglogrepl.LSN // per event: the last position confirmable while it waits
	since   time.Time
}

// publishLoop publishes what the receiver hands it, in batches of whole
// transactions, and advances the confirmed position past each batch once
// every event of it was accepted by the broker or written to the table.
func (r *Relay) publishLoop(ctx context.Context, in <-chan item) error {
	held := map[string]bool{}
	waits := map[string]*waiting{}
	var heldAt time.Time
	prevEnd := pglogrepl.LSN(r.confirmed.Load())
	if r.order {
		if err := r.refreshHeld(ctx, held); err != nil {
			return err
		}
		heldAt = time.Now()
	}
	tick := time.NewTicker(recheckHeld)
	defer tick.Stop()
	for {
		var batch []item
		select {
		case <-ctx.Done():
			return nil
		case it := <-in:
			batch = append(batch, it)
		case <-tick.C:
		}
		n := 0
		if len(batch) > 0 {
			n = len(batch[0].events)
		}
	gather:
		for len(batch) > 0 && n < r.ropts.BatchSize {
			select {
			case it := <-in:
				batch = append(batch, it)
				n += len(it.events)
			default:
				break gather
			}
		}
		r.brokerBackViaTable()
		if r.order && (len(held) > 0 || len(waits) > 0) && time.Since(heldAt) >= recheckHeld {
			if err := r.refreshHeld(ctx, held); err != nil {
				return err
			}
			heldAt = time.Now()
			if err := r.release(ctx, held, waits); err != nil {
				return err
			}
		}
		var direct []core.Event
		for _, it := range batch {
			for _, ev := range it.events {
				if r.order && ev.AggregateID != "" && (held[ev.AggregateID] || waits[ev.AggregateID] != nil) {
					w := waits[ev.AggregateID]
					if w == nil {
						w = &waiting{since: time.Now()}
						waits[ev.AggregateID] = w
					}
					w.events = append(w.events, ev)
					w.blockAt = append(w.blockAt, prevEnd)
					continue
				}
				direct = append(direct, ev)
			}
			prevEnd = it.end
		}
		if len(direct) > 0 {
			if err := r.handle(ctx, direct, held); err != nil {
				return err
			}
			r.inflight.Add(-int64(len(direct)))
		}
		pos := prevEnd
		for _, w := range waits {
			pos = min(pos, w.blockAt[0])
		}
		r.oldest.Store(0)
		if (len(in) > 0 && n > 0) || pos < prevEnd {
			// Later transactions wait: the oldest unconfirmed event is
			// at most as old as the latest commit handled.
			r.oldest.Store(batchCommit(batch))
		}
		if uint64(pos) > r.confirmed.Load() {
			r.confirmed.Store(uint64(pos))
		}
	}
}

// recheckHeld is how often, in ordered mode, the stream asks the table
// which aggregates it still holds, while some are.
const recheckHeld = 50 * time.Millisecond

// batchCommit is the commit time of the latest transaction of batch with
// events (keepalives have none), or now.
func batchCommit(batch []item) int64 {
	for i := len(batch) - 1; i >= 0; i-- {
		if len(batch[i].events) > 0 && !batch[i].commit.IsZero() {
			return batch[i].commit.UnixNano()
		}
	}
	return time.Now().UnixNano()
}

// release publishes the waiting events of aggregates the table no longer
// holds, and writes those that waited SpillAfter to the table behind the
// events they wait for.
func (r *Relay) release(ctx context.Context, held map[string]bool, waits map[string]*waiting) error {
	var free, spill []core.Event
	for agg, w := range waits {
		switch {
		case !held[agg]:
			free = append(free, w.events...)
		case time.Since(w.since) >= r.opts.SpillAfter:
			spill = append(spill, w.events...)
		default:
			continue
		}
		delete(waits, agg)
	}
	if len(free) > 0 {
		if err := r.handle(ctx, free, held); err != nil {
			return err
		}
	}
	if len(spill) > 0 {
		rows := make([]tableRow, len(spill))
		for i := range spill {
			rows[i] = tableRow{ev: &spill[i]}
		}
		if err := r.toTable(ctx, rows, held); err != nil {
			return err
		}
	}
	r.inflight.Add(-int64(len(free) + len(spill)))
	return nil
}

// brokerBackViaTable clears the stream's "broker down" once the table
// relay published something since: in ordered mode a stream whose
// aggregates all wait for the table publishes nothing itself, and would
// otherwise report the broker down long after it came back.
func (r *Relay) brokerBackViaTable() {
	if r.brokerDown.Load() && r.table.Counters().Published > r.tableAtDown.Load() && !r.table.Health().BrokerDown {
		if r.brokerDown.CompareAndSwap(true, false) {
			r.log.Info("txoutbox: log: the broker takes events again (from the table's retry path)")
		}
	}
}

// refreshHeld replaces held with the aggregates that have unpublished rows
// in the table: their later events must follow them there.
func (r *Relay) refreshHeld(ctx context.Context, held map[string]bool) error {
	rows, err := r.pool.Query(ctx, r.heldQ)
	if err != nil {
		return fmt.Errorf("logrelay: read the aggregates waiting in the table: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("logrelay: read the aggregates waiting in the table: %w", err)
	}
	clear(held)
	for _, id := range ids {
		held[id] = true
	}
	return nil
}

// tableRow is one event bound for the table, with its bookkeeping.
type tableRow struct {
	ev      *core.Event
	failure *core.Failure // nil: held behind an earlier event
}

// handle publishes events (in commit order) and writes the ones that
// failed, and in ordered mode the later events of their aggregates, to the
// table. It returns an error only when the table cannot be written: the
// session then ends and the events are streamed again.
func (r *Relay) handle(ctx context.Context, events []core.Event, held map[string]bool) error {
	var toTable []tableRow
	if !r.order {
		for start := 0; start < len(events); start += r.ropts.BatchSize {
			chunk := events[start:min(start+r.ropts.BatchSize, len(events))]
			fails, err := r.publish(ctx, chunk)
			if err != nil {
				return err
			}
			for i := range chunk {
				if fails[i] != nil {
					toTable = append(toTable, tableRow{ev: &chunk[i], failure: fails[i]})
				}
			}
		}
		return r.toTable(ctx, toTable, held)
	}
	// Ordered: rounds, as the table relay's ordered batches, so that no
	// event goes out before the earlier events of its aggregate.
	var groups [][]int
	byAgg := map[string]int{}
	for i := range events {
		ev := &events[i]
		if ev.AggregateID == "" {
			groups = append(groups, []int{i})
			continue
		}
		g, ok := byAgg[ev.AggregateID]
		if !ok {
			g = len(groups)
			byAgg[ev.AggregateID] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	stopped := make([]bool, len(groups))
	for round := 0; ; round++ {
		var idx, from []int // event and group of each event of the round
		for g, is := range groups {
			if !stopped[g] && round < len(is) {
				idx = append(idx, is[round])
				from = append(from, g)
			}
		}
		if len(idx) == 0 {
			break
		}
		batch := make([]core.Event, len(idx))
		for k, i := range idx {
			batch[k] = events[i]
		}
		fails, err := r.publish(ctx, batch)
		if err != nil {
			return err
		}
		for k, i := range idx {
			if fails[k] == nil {
				continue
			}
			toTable = append(toTable, tableRow{ev: &events[i], failure: fails[k]})
			g := from[k]
			stopped[g] = true
			for _, later := range groups[g][round+1:] {
				toTable = append(toTable, tableRow{ev: &events[later]})
			}
		}
	}
	return r.toTable(ctx, toTable, held)
}

// publish publishes events and returns each one's failure (nil when the
// broker accepted it). Its error is only ctx's.
func (r *Relay) publish(ctx context.Context, events []core.Event) ([]*core.Failure, error) {
	pctx, cancel := ctx, context.CancelFunc(func() {})
	if d := r.ropts.PublishTimeout; d > 0 {
		pctx, cancel = context.WithTimeoutCause(ctx, d, core.ErrPublishTimeout)
	}
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("txoutbox: publisher panicked: %v", p)
			}
		}()
		return r.pub.Publish(pctx, events)
	}()
	timedOut := errors.Is(context.Cause(pctx), core.ErrPublishTimeout)
	cancel()
	if ctx.Err() != nil {
		return nil, ctx.Err() // shutdown: outcomes unknown, nothing confirmed
	}
	errs := core.EventErrors(err, len(events))
	fails := make([]*core.Failure, len(events))
	var ok, failed int
	var first error
	for i, e := range errs {
		if e == nil {
			ok++
			continue
		}
		if timedOut && errors.Is(e, context.DeadlineExceeded) {
			e = fmt.Errorf("%w after %s: %w", core.ErrPublishTimeout, r.ropts.PublishTimeout, e)
		}
		failed++
		if first == nil {
			first = e
		}
		msg := e.Error()
		if limit := r.ropts.MaxErrorLength; limit > 0 && len(msg) > limit {
			msg = strings.ToValidUTF8(msg[:limit], "")
		}
		fails[i] = &core.Failure{
			Seq: events[i].Seq, Err: msg, RetryIn: r.ropts.Retry.Backoff(1),
			Dead: core.IsPermanent(e) || r.ropts.Retry.Exhausted(1),
		}
	}
	r.c.published.Add(int64(ok))
	r.c.failed.Add(int64(failed))
	switch {
	case ok > 0:
		if r.brokerDown.CompareAndSwap(true, false) {
			r.log.Info("txoutbox: log: the broker takes events again")
		}
	case failed > 0:
		if r.brokerDown.CompareAndSwap(false, true) {
			r.tableAtDown.Store(r.table.Counters().Published)
			r.log.Warn("txoutbox: log: the broker took no event of the batch; events go to the table's retry path (logged once until it takes events again)",
				"events", len(events), "first_error", first)
		}
	}
	if failed > 0 && ok > 0 {
		r.log.Warn("txoutbox: log: publish failed; the events go to the table's retry path", "failed", failed, "of", len(events), "first_error", first)
	}
	return fails, nil
}

// toTable writes rows to the outbox table under relaySetting, so that the
// trigger keeps them, in one transaction; rows already there (written
// before a crash, then streamed again) are left as they are.
func (r *Relay) toTable(ctx context.Context, rows []tableRow, held map[string]bool) error {
	if len(rows) == 0 {
		return nil
	}
	slices.SortFunc(rows, func(a, b tableRow) int { return cmp.Compare(a.ev.Seq, b.ev.Seq) })
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue("SELECT set_config('" + relaySetting + "', 'on', true)")
		for _, tr := range rows {
			ev := tr.ev
			headers := ev.Headers
			if headers == nil {
				headers = map[string]string{}
			}
			attempts, lastErr, retryIn, dead := 0, (*string)(nil), int64(0), false
			if f := tr.failure; f != nil {
				attempts, lastErr, retryIn, dead = 1, &f.Err, f.RetryIn.Microseconds(), f.Dead
			}
			b.Queue(r.insert, ev.Seq, ev.ID, ev.AggregateType, ev.AggregateID, ev.EventType, []byte(ev.Payload), headers,
				ev.CreatedAt, attempts, lastErr, retryIn, dead)
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		r.storeDown.Store(true)
		return fmt.Errorf("logrelay: hand %d events to the table's retry path: %w", len(rows), err)
	}
	r.table.Notify()
	var nheld, dead int
	for _, tr := range rows {
		if tr.failure == nil {
			nheld++
		} else if tr.failure.Dead {
			dead++
		}
		if r.order && tr.ev.AggregateID != "" && (tr.failure == nil || !tr.failure.Dead || r.ropts.Ordered.DeadLetter == core.DeadLetterBlock) {
			held[tr.ev.AggregateID] = true
		}
	}
	r.c.held.Add(int64(nheld))
	if dead > 0 {
		r.log.Error("txoutbox: log: events dead-lettered (kept in the table; re-queue with txoutbox dead retry)", "dead_lettered", dead)
	}
	return nil
}
