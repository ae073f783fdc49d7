// Package logstream is what log mode does once a database's log has been
// read: it publishes the events of committed transactions in commit order,
// hands the events the broker refused to the outbox table's retry path
// (and, in ordered mode, the later events of their aggregates behind them),
// and says which position of the log is handled, so that the reader can
// confirm it. The readers are logrelay (PostgreSQL's logical replication)
// and binlogrelay (MySQL's and MariaDB's binlog); they differ in how they
// read the log, confirm a position and write to the table, not in this.
package logstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// Item is what a reader hands the publisher: the events of one committed
// transaction (or none: a position with nothing to publish, such as an
// idle server's), and the position to confirm once they are handled. End
// orders the log: a later transaction has a greater End.
type Item struct {
	Events []core.Event
	End    uint64
	Commit time.Time
}

// Row is one event bound for the table, with its bookkeeping.
type Row struct {
	Event   *core.Event
	Failure *core.Failure // nil: held behind an earlier event of its aggregate, or scheduled
	// Scheduled: the event's NotBefore is ahead; it holds nothing back.
	// A table writes every row without a Failure due at the later of now
	// and its NotBefore.
	Scheduled bool
}

// Table is the outbox table as the stream writes to it.
type Table interface {
	// Write writes rows, sorted by Seq, in one transaction: the failed ones
	// with their attempt, error and backoff, the held ones as fresh
	// events. A row already there (written before a crash, then read from
	// the log again) must not be reset.
	Write(ctx context.Context, rows []Row) error
	// Held returns the aggregates with unpublished rows in the table:
	// their later events must follow them there (ordered mode).
	Held(ctx context.Context) ([]string, error)
}

// Options configures a Stream.
type Options struct {
	// Table is where failed and held events go.
	Table Table
	// Relay is the table's relay (the retry path): its options (batch
	// size, publish timeout, retry, ordering) are the stream's, and the
	// stream wakes it after writing to the table.
	Relay *core.Relay
	// Publisher receives the events.
	Publisher core.Publisher
	// SpillAfter is how long, in ordered mode, the events of an aggregate
	// whose earlier event is in the table wait in memory for the table to
	// publish it before they are written to the table behind it.
	SpillAfter time.Duration
	// HoldOnBrokerDown is how long the stream retries, with backoff, a
	// batch of which the broker took no event (it is down, or its
	// connection is being restored), before it hands the batch to the
	// table's retry path: a short outage then writes nothing to the table
	// and sends nothing later than it has to. The position is not
	// confirmed meanwhile, and what the reader reads waits in memory.
	// 0 hands a failed batch over at once.
	HoldOnBrokerDown time.Duration
	// Positions, when not nil, is what Publisher wraps (or is) that
	// stores the stream's position with each batch, atomically
	// (core.PositionPublisher): the stream then publishes each batch in
	// one call whose context carries the position it ends at, and skips
	// what the log sends again up to the position it finds stored when a
	// session starts.
	Positions core.PositionPublisher
}

// DefaultHoldOnBrokerDown is the readers' default HoldOnBrokerDown.
const DefaultHoldOnBrokerDown = 5 * time.Second

// Counters are a Stream's totals.
type Counters struct {
	Published, Failed, Held, Confirms, Streams int64
	// Scheduled counts events handed to the table to wait for their
	// NotBefore.
	Scheduled int64
	// Skipped counts events read again that the broker already had with
	// the stream's position (Options.Positions).
	Skipped int64
}

// Stream is the publishing half of log mode. Its methods are safe for
// concurrent use; Publish runs one at a time.
type Stream struct {
	opts  Options
	ropts core.RelayOptions
	order bool
	log   *slog.Logger

	confirmed atomic.Uint64 // every event before it is handled
	moved     chan struct{} // receives, coalesced, when confirmed moves
	// oldest is the commit time (unix nanos) of the oldest event received
	// and not yet handled; 0 when none.
	oldest      atomic.Int64
	inflight    atomic.Int64
	streaming   atomic.Bool
	brokerDown  atomic.Bool
	tableAtDown atomic.Int64 // the table relay's Published when the stream found the broker down
	storeDown   atomic.Bool
	c           struct{ published, failed, held, confirms, streams, scheduled, skipped atomic.Int64 }
}

// New returns a Stream.
func New(opts Options) *Stream {
	ropts := opts.Relay.Options()
	return &Stream{opts: opts, ropts: ropts, order: opts.Relay.Ordered(), log: ropts.Logger, moved: make(chan struct{}, 1)}
}

// Ordered reports whether the stream keeps per-aggregate order.
func (s *Stream) Ordered() bool { return s.order }

// Logger is the relay's logger.
func (s *Stream) Logger() *slog.Logger { return s.log }

// Confirmed is the position before which every event is handled.
func (s *Stream) Confirmed() uint64 { return s.confirmed.Load() }

// Moved receives after Confirmed moved; several moves may come as one.
// A reader that reports the position to its server waits on it as well
// as on the server, so that a relay killed right after a publish leaves
// its successor as little as possible to send again.
func (s *Stream) Moved() <-chan struct{} { return s.moved }

// Started records the start of a streaming session from pos.
func (s *Stream) Started(pos uint64) {
	s.confirmed.Store(pos)
	s.streaming.Store(true)
	s.c.streams.Add(1)
}

// Stopped records the end of a session: what was received and not handled
// will be read again.
func (s *Stream) Stopped() {
	s.streaming.Store(false)
	s.inflight.Store(0)
	s.oldest.Store(0)
}

// Streaming reports whether a session is streaming.
func (s *Stream) Streaming() bool { return s.streaming.Load() }

// Received counts an item's events as pending until Publish handles them.
func (s *Stream) Received(it Item) {
	if len(it.Events) > 0 {
		s.inflight.Add(int64(len(it.Events)))
		s.oldest.CompareAndSwap(0, it.Commit.UnixNano())
	}
}

// Pending returns the events received and not yet handled, and the
// commit time of the oldest (zero when none).
func (s *Stream) Pending() (int64, time.Time) {
	var oldest time.Time
	if o := s.oldest.Load(); o != 0 {
		oldest = time.Unix(0, o)
	}
	return max(s.inflight.Load(), 0), oldest
}

// Confirmation counts a position sent to the server.
func (s *Stream) Confirmation() { s.c.confirms.Add(1) }

// Counters returns the stream's totals.
func (s *Stream) Counters() Counters {
	return Counters{
		Published: s.c.published.Load(), Failed: s.c.failed.Load(), Held: s.c.held.Load(),
		Confirms: s.c.confirms.Load(), Streams: s.c.streams.Load(), Scheduled: s.c.scheduled.Load(),
		Skipped: s.c.skipped.Load(),
	}
}

// Health is the stream's and the retry path's view of the dependencies.
func (s *Stream) Health() core.RelayHealth {
	h := s.opts.Relay.Health()
	h.BrokerDown = h.BrokerDown || s.brokerDown.Load()
	h.StoreDown = h.StoreDown || s.storeDown.Load()
	return h
}

// SetStoreDown records whether the database is unreachable to the stream.
func (s *Stream) SetStoreDown(down bool) { s.storeDown.Store(down) }

// waiting is an aggregate's events that arrived while an earlier event of
// it was in the table's retry path (ordered mode). They wait in memory for
// the table to publish it, so that the aggregate returns to the stream as
// soon as it did; after SpillAfter they are written to the table behind it
// instead, so that the confirmed position never waits longer than that.
type waiting struct {
	events  []core.Event
	blockAt []uint64 // per event: the last position confirmable while it waits
	since   time.Time
}

// recheckHeld is how often, in ordered mode, the stream asks the table
// which aggregates it still holds, while some are.
const recheckHeld = 50 * time.Millisecond

// Publish publishes what the reader hands it, in batches of whole
// transactions, and advances the confirmed position past each batch once
// every event of it was accepted by the broker or written to the table.
// It returns nil when ctx ends, and an error when the table cannot be
// written: the session then ends and the events are read again.
func (s *Stream) Publish(ctx context.Context, in <-chan Item) error {
	held := map[string]bool{}
	waits := map[string]*waiting{}
	var heldAt time.Time
	prevEnd := s.confirmed.Load()
	// With Positions, what the broker already has (a batch published
	// before a kill, and not confirmed to the database) is skipped.
	var skipThrough uint64
	if pp := s.opts.Positions; pp != nil {
		var err error
		if skipThrough, err = pp.CommittedPosition(ctx); err != nil {
			s.brokerDown.Store(true)
			return fmt.Errorf("txoutbox: log: read the position stored with the broker: %w", err)
		}
		s.brokerDown.Store(false)
		if skipThrough > prevEnd {
			s.log.Info("txoutbox: log: the broker has events past the confirmed position; they are not sent again",
				"confirmed", prevEnd, "broker_position", skipThrough)
		}
	}
	if s.order {
		if err := s.refreshHeld(ctx, held); err != nil {
			return err
		}
		heldAt = time.Now()
	}
	tick := time.NewTicker(recheckHeld)
	defer tick.Stop()
	for {
		var batch []Item
		select {
		case <-ctx.Done():
			return nil
		case it := <-in:
			batch = append(batch, it)
		case <-tick.C:
		}
		n := 0
		if len(batch) > 0 {
			n = len(batch[0].Events)
		}
	gather:
		for len(batch) > 0 && n < s.ropts.BatchSize {
			select {
			case it := <-in:
				batch = append(batch, it)
				n += len(it.Events)
			default:
				break gather
			}
		}
		s.brokerBackViaTable()
		if s.order && (len(held) > 0 || len(waits) > 0) && time.Since(heldAt) >= recheckHeld {
			if err := s.refreshHeld(ctx, held); err != nil {
				return err
			}
			heldAt = time.Now()
			if err := s.release(ctx, held, waits); err != nil {
				return err
			}
		}
		var direct []core.Event
		var scheduled []Row
		for _, it := range batch {
			if it.End <= skipThrough && len(it.Events) > 0 {
				s.c.skipped.Add(int64(len(it.Events)))
				s.inflight.Add(-int64(len(it.Events)))
				prevEnd = max(prevEnd, it.End)
				continue
			}
			for _, ev := range it.Events {
				if !ev.NotBefore.IsZero() {
					scheduled = append(scheduled, Row{Event: &ev, Scheduled: true})
					continue
				}
				if s.order && ev.AggregateID != "" && held[ev.AggregateID] && s.opts.Positions != nil {
					// The stored position covers every event before it,
					// so none may wait in memory past it: the event
					// goes to the table behind the one it follows.
					scheduled = append(scheduled, Row{Event: &ev})
					continue
				}
				if s.order && ev.AggregateID != "" && (held[ev.AggregateID] || waits[ev.AggregateID] != nil) {
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
			prevEnd = it.End
		}
		if len(scheduled) > 0 {
			// Not due yet: the table's relay publishes them at their time.
			if err := s.toTable(ctx, scheduled, held); err != nil {
				return err
			}
			s.inflight.Add(-int64(len(scheduled)))
		}
		if len(direct) > 0 {
			var err error
			if s.opts.Positions != nil {
				err = s.handleThrough(ctx, direct, prevEnd, held)
			} else {
				err = s.handle(ctx, direct, held)
			}
			if err != nil {
				return err
			}
			s.inflight.Add(-int64(len(direct)))
		}
		pos := prevEnd
		for _, w := range waits {
			pos = min(pos, w.blockAt[0])
		}
		s.oldest.Store(0)
		if (len(in) > 0 && n > 0) || pos < prevEnd {
			// Later transactions wait: the oldest unconfirmed event is
			// at most as old as the latest commit handled.
			s.oldest.Store(batchCommit(batch))
		}
		if pos > s.confirmed.Load() {
			s.confirmed.Store(pos)
			select {
			case s.moved <- struct{}{}:
			default:
			}
		}
	}
}

// batchCommit is the commit time of the latest transaction of batch with
// events, or now.
func batchCommit(batch []Item) int64 {
	for i := len(batch) - 1; i >= 0; i-- {
		if len(batch[i].Events) > 0 && !batch[i].Commit.IsZero() {
			return batch[i].Commit.UnixNano()
		}
	}
	return time.Now().UnixNano()
}

// release publishes the waiting events of aggregates the table no longer
// holds, and writes those that waited SpillAfter to the table behind the
// events they wait for.
func (s *Stream) release(ctx context.Context, held map[string]bool, waits map[string]*waiting) error {
	var free, spill []core.Event
	for agg, w := range waits {
		switch {
		case !held[agg]:
			free = append(free, w.events...)
		case time.Since(w.since) >= s.opts.SpillAfter:
			spill = append(spill, w.events...)
		default:
			continue
		}
		delete(waits, agg)
	}
	if len(free) > 0 {
		if err := s.handle(ctx, free, held); err != nil {
			return err
		}
	}
	if len(spill) > 0 {
		rows := make([]Row, len(spill))
		for i := range spill {
			rows[i] = Row{Event: &spill[i]}
		}
		if err := s.toTable(ctx, rows, held); err != nil {
			return err
		}
	}
	s.inflight.Add(-int64(len(free) + len(spill)))
	return nil
}

// brokerBackViaTable clears the stream's "broker down" once the table
// relay published something since: in ordered mode a stream whose
// aggregates all wait for the table publishes nothing itself, and would
// otherwise report the broker down long after it came back.
func (s *Stream) brokerBackViaTable() {
	t := s.opts.Relay
	if s.brokerDown.Load() && t.Counters().Published > s.tableAtDown.Load() && !t.Health().BrokerDown {
		if s.brokerDown.CompareAndSwap(true, false) {
			s.log.Info("txoutbox: log: the broker takes events again (from the table's retry path)")
		}
	}
}

// refreshHeld replaces held with the aggregates that have unpublished rows
// in the table.
func (s *Stream) refreshHeld(ctx context.Context, held map[string]bool) error {
	ids, err := s.opts.Table.Held(ctx)
	if err != nil {
		return fmt.Errorf("txoutbox: log: read the aggregates waiting in the table: %w", err)
	}
	clear(held)
	for _, id := range ids {
		held[id] = true
	}
	return nil
}

// handle publishes events (in commit order) and writes the ones that
// failed, and in ordered mode the later events of their aggregates, to the
// table. It returns an error only when the table cannot be written.
func (s *Stream) handle(ctx context.Context, events []core.Event, held map[string]bool) error {
	var toTable []Row
	if !s.order {
		for start := 0; start < len(events); start += s.ropts.BatchSize {
			chunk := events[start:min(start+s.ropts.BatchSize, len(events))]
			fails, err := s.publishHeld(ctx, chunk)
			if err != nil {
				return err
			}
			for i := range chunk {
				if fails[i] != nil {
					toTable = append(toTable, Row{Event: &chunk[i], Failure: fails[i]})
				}
			}
		}
		return s.toTable(ctx, toTable, held)
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
		fails, err := s.publishHeld(ctx, batch)
		if err != nil {
			return err
		}
		for k, i := range idx {
			if fails[k] == nil {
				continue
			}
			toTable = append(toTable, Row{Event: &events[i], Failure: fails[k]})
			g := from[k]
			stopped[g] = true
			for _, later := range groups[g][round+1:] {
				toTable = append(toTable, Row{Event: &events[later]})
			}
		}
	}
	return s.toTable(ctx, toTable, held)
}

// handleThrough publishes events with the position end, in one call.
// Events the broker refuses for good go to the table as dead letters (in
// ordered mode with the later events of their aggregates behind them), and
// the rest is published again without them.
// A batch the broker does not take is retried with backoff for up to
// HoldOnBrokerDown, and never handed to the table: after each failure the
// stream reads the stored position again, which tells it whether a commit
// whose outcome it did not learn went through. After that it returns an
// error: the session ends, and the next one starts from the position.
func (s *Stream) handleThrough(ctx context.Context, events []core.Event, end uint64, held map[string]bool) error {
	deadline := time.Now().Add(s.opts.HoldOnBrokerDown)
	wait := 50 * time.Millisecond
	for len(events) > 0 {
		fails, permanent, err := s.publish(ctx, events, &end)
		if err != nil {
			return err
		}
		var rows []Row
		var rest []core.Event
		stopped := map[string]bool{}
		var first *core.Failure
		for i := range events {
			ev := &events[i]
			switch {
			case fails[i] != nil && permanent[i]:
				f := *fails[i]
				f.Dead = true
				rows = append(rows, Row{Event: ev, Failure: &f})
				if s.order && ev.AggregateID != "" {
					stopped[ev.AggregateID] = true
				}
			case s.order && ev.AggregateID != "" && stopped[ev.AggregateID]:
				rows = append(rows, Row{Event: ev})
			default:
				rest = append(rest, *ev)
				if fails[i] != nil && first == nil {
					first = fails[i]
				}
			}
		}
		if first == nil {
			// Taken, but for the events refused for good.
			return s.toTable(ctx, rows, held)
		}
		if len(rows) > 0 {
			// The others were held back by these: send them again
			// without them, at once.
			if err := s.toTable(ctx, rows, held); err != nil {
				return err
			}
			events = rest
			continue
		}
		if time.Now().Add(wait).After(deadline) {
			return fmt.Errorf("txoutbox: log: the broker took no transaction for %s: %s", s.opts.HoldOnBrokerDown, first.Err)
		}
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
		wait = min(2*wait, time.Second)
		pos, err := s.opts.Positions.CommittedPosition(ctx)
		if err != nil {
			continue
		}
		if pos >= end {
			// The commit went through; only its answer was lost.
			s.c.published.Add(int64(len(events)))
			s.brokerDown.Store(false)
			return nil
		}
	}
	return nil
}

// publishHeld is publish, retried with backoff for up to HoldOnBrokerDown
// while the broker takes no event of the batch and no failure is
// permanent.
func (s *Stream) publishHeld(ctx context.Context, events []core.Event) ([]*core.Failure, error) {
	deadline := time.Now().Add(s.opts.HoldOnBrokerDown)
	wait := 50 * time.Millisecond
	for {
		fails, _, err := s.publish(ctx, events, nil)
		if err != nil || !allTransient(fails) || time.Now().Add(wait).After(deadline) {
			return fails, err
		}
		if !sleep(ctx, wait) {
			return nil, ctx.Err()
		}
		wait = min(2*wait, time.Second)
	}
}

// allTransient reports whether every event failed, none for good.
func allTransient(fails []*core.Failure) bool {
	for _, f := range fails {
		if f == nil || f.Dead {
			return false
		}
	}
	return len(fails) > 0
}

// publish publishes events (with Positions and a non-nil end, together
// with that position) and returns each one's failure (nil when the broker
// accepted it) and whether that failure is for good. Its error is only
// ctx's.
func (s *Stream) publish(ctx context.Context, events []core.Event, end *uint64) ([]*core.Failure, []bool, error) {
	pctx, cancel := ctx, context.CancelFunc(func() {})
	if d := s.ropts.PublishTimeout; d > 0 {
		pctx, cancel = context.WithTimeoutCause(ctx, d, core.ErrPublishTimeout)
	}
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("txoutbox: publisher panicked: %v", p)
			}
		}()
		if end != nil {
			pctx = core.WithPosition(pctx, *end)
		}
		return s.opts.Publisher.Publish(pctx, events)
	}()
	timedOut := errors.Is(context.Cause(pctx), core.ErrPublishTimeout)
	cancel()
	if ctx.Err() != nil && err != nil {
		// Shutdown cut the publish: outcomes unknown, nothing confirmed.
		// A publish that returned nil was taken whole, stop or not: the
		// stop's stored position must cover it, or the next relay sends
		// it again.
		return nil, nil, ctx.Err()
	}
	errs := core.EventErrors(err, len(events))
	fails := make([]*core.Failure, len(events))
	permanent := make([]bool, len(events))
	var ok, failed int
	var first error
	for i, e := range errs {
		if e == nil {
			ok++
			continue
		}
		if timedOut && errors.Is(e, context.DeadlineExceeded) {
			e = fmt.Errorf("%w after %s: %w", core.ErrPublishTimeout, s.ropts.PublishTimeout, e)
		}
		failed++
		if first == nil {
			first = e
		}
		msg := e.Error()
		if limit := s.ropts.MaxErrorLength; limit > 0 && len(msg) > limit {
			msg = strings.ToValidUTF8(msg[:limit], "")
		}
		permanent[i] = core.IsPermanent(e)
		fails[i] = &core.Failure{
			Seq: events[i].Seq, Err: msg, RetryIn: s.ropts.Retry.Backoff(1),
			Dead: permanent[i] || s.ropts.Retry.Exhausted(1),
		}
	}
	s.c.published.Add(int64(ok))
	switch {
	case ok > 0:
		if s.brokerDown.CompareAndSwap(true, false) {
			s.log.Info("txoutbox: log: the broker takes events again")
		}
	case failed > 0:
		if s.brokerDown.CompareAndSwap(false, true) && end == nil {
			s.tableAtDown.Store(s.opts.Relay.Counters().Published)
			s.log.Warn("txoutbox: log: the broker took no event of the batch; the stream retries it, then hands it to the table's retry path (logged once until it takes events again)",
				"events", len(events), "hold", s.opts.HoldOnBrokerDown, "first_error", first)
		}
	}
	if failed > 0 && ok > 0 {
		s.log.Warn("txoutbox: log: publish failed; the events go to the table's retry path", "failed", failed, "of", len(events), "first_error", first)
	}
	return fails, permanent, nil
}

// toTable writes rows to the table, then wakes its relay and notes the
// aggregates the table now holds.
func (s *Stream) toTable(ctx context.Context, rows []Row, held map[string]bool) error {
	if len(rows) == 0 {
		return nil
	}
	slices.SortFunc(rows, func(a, b Row) int { return cmp.Compare(a.Event.Seq, b.Event.Seq) })
	if err := s.opts.Table.Write(ctx, rows); err != nil {
		s.storeDown.Store(true)
		return fmt.Errorf("txoutbox: log: hand %d events to the table's retry path: %w", len(rows), err)
	}
	s.opts.Relay.Notify()
	var nheld, nfailed, nsched, dead int
	for _, r := range rows {
		if r.Scheduled {
			nsched++
			continue
		}
		if r.Failure == nil {
			nheld++
		} else {
			nfailed++
			if r.Failure.Dead {
				dead++
			}
		}
		if s.order && r.Event.AggregateID != "" && (r.Failure == nil || !r.Failure.Dead || s.ropts.Ordered.DeadLetter == core.DeadLetterBlock) {
			held[r.Event.AggregateID] = true
		}
	}
	s.c.held.Add(int64(nheld))
	s.c.scheduled.Add(int64(nsched))
	s.c.failed.Add(int64(nfailed))
	if dead > 0 {
		s.log.Error("txoutbox: log: events dead-lettered (kept in the table; re-queue with txoutbox dead retry)", "dead_lettered", dead)
	}
	return nil
}
