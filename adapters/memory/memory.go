// Package memoutbox is an outbox in memory: the reference implementation of
// core.Store, which passes the same conformance suites (outboxtest.RunStore,
// RunOrderedStore) as the SQL stores, and a store for unit tests of code
// that runs a relay.
//
// Its transactions are in-process stand-ins for a database's: Begin, then
// Enqueue, then Commit or Rollback. Nothing survives the process, so it is
// not an outbox for production; it shows what a Store must do, in a few
// hundred lines with nothing else in the way.
//
//	store := memoutbox.New(memoutbox.Options{})
//	relay, _ := core.NewRelay(store, publisher, core.RelayOptions{})
//	go relay.Run(ctx)
//
//	tx := store.Begin()
//	_ = store.Enqueue(ctx, tx, ev) // validated, ID assigned
//	_ = tx.Commit()                // visible to claims; the relay wakes
package memoutbox

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// Options configures a Store. Zero fields take their defaults.
type Options struct {
	// Now is the store's clock (the database's clock of a SQL store).
	// Default time.Now.
	Now func() time.Time
	// Limits bound the events Enqueue accepts. Default core.DefaultLimits.
	Limits core.Limits
	// Hooks run on every event before it is validated and stored.
	Hooks []core.EnqueueHook
}

// Store is an outbox in memory. It is safe for concurrent use.
type Store struct {
	opts    Options
	limits  core.Limits
	signal  core.Signal
	mu      sync.Mutex
	events  []*core.Event // in Seq order
	seq     int64
	held    map[int64]*claim // seq -> the open claim holding it
	parts   map[int]*claim   // partition -> the open ordered claim serving it
	claimID int64
}

// What the relay, the monitor and retention find on a Store.
var (
	_ core.Store         = (*Store)(nil)
	_ core.StatsReader   = (*Store)(nil)
	_ core.Cleaner       = (*Store)(nil)
	_ core.WakeupSource  = (*Store)(nil)
	_ core.NextDueReader = (*Store)(nil)
)

// New returns an empty Store. It panics on invalid Limits; use NewChecked to
// get an error instead.
func New(opts Options) *Store {
	s, err := NewChecked(opts)
	if err != nil {
		panic(err)
	}
	return s
}

// NewChecked returns an empty Store, or an error wrapping
// core.ErrInvalidOptions for invalid Limits.
func NewChecked(opts Options) (*Store, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	l, err := opts.Limits.WithDefaults()
	if err != nil {
		return nil, err
	}
	return &Store{opts: opts, limits: l, held: map[int64]*claim{}, parts: map[int]*claim{}}, nil
}

// Capabilities implements core.Store: ordered claims of chosen
// partitions, no concurrency limit. Relays in one process need no leaser:
// a partition is never served by two open claims.
func (s *Store) Capabilities() core.StoreCapabilities {
	return core.StoreCapabilities{OrderedClaims: true, OrderedPartitions: true}
}

// Wakeups implements core.WakeupSource: a signal notified at every commit
// that wrote events.
func (s *Store) Wakeups() *core.Signal { return &s.signal }

// NextDue implements core.NextDueReader, by the store's clock.
func (s *Store) NextDue(ctx context.Context) (time.Duration, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	var next time.Time
	for _, e := range s.events {
		if e.PublishedAt == nil && e.DeadAt == nil && e.NextAttemptAt.After(now) && (next.IsZero() || e.NextAttemptAt.Before(next)) {
			next = e.NextAttemptAt
		}
	}
	if next.IsZero() {
		return 0, false, nil
	}
	return next.Sub(now), true, nil
}

// Tx is a transaction of a Store: events enqueued in it become visible to
// claims at Commit, and are dropped by Rollback.
type Tx struct {
	s       *Store
	mu      sync.Mutex
	pending []core.Event
	done    bool
}

// Begin starts a transaction.
func (s *Store) Begin() *Tx { return &Tx{s: s} }

// Enqueue adds events to tx, so that they are stored if and only if tx
// commits. Events are prepared in place (ID, validation against the
// Limits, hooks); an invalid event fails the call with an error wrapping
// core.ErrInvalidEvent and adds nothing, and tx stays usable. A nil or
// finished tx fails with core.ErrNoTransaction.
func (s *Store) Enqueue(ctx context.Context, tx *Tx, events ...core.Event) error {
	if tx == nil || tx.s != s {
		return fmt.Errorf("%w: memoutbox.Enqueue needs a transaction of this store (Store.Begin)", core.ErrNoTransaction)
	}
	if err := core.PrepareEvents(ctx, events, s.limits, s.opts.Hooks); err != nil {
		return err
	}
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return fmt.Errorf("%w: the transaction is already committed or rolled back", core.ErrNoTransaction)
	}
	for _, ev := range events {
		ev.Payload = slices.Clone(ev.Payload)
		ev.Headers = cloneHeaders(ev.Headers)
		tx.pending = append(tx.pending, ev)
	}
	return nil
}

// Commit stores the transaction's events, assigns their Seq and CreatedAt,
// and wakes the relays running on the store.
func (tx *Tx) Commit() error {
	tx.mu.Lock()
	if tx.done {
		tx.mu.Unlock()
		return fmt.Errorf("%w: the transaction is already committed or rolled back", core.ErrNoTransaction)
	}
	tx.done = true
	pending := tx.pending
	tx.pending = nil
	tx.mu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	s := tx.s
	s.mu.Lock()
	now := s.opts.Now()
	for _, ev := range pending {
		s.seq++
		ev.Seq = s.seq
		ev.CreatedAt = now
		ev.NextAttemptAt = now
		if ev.NotBefore.After(now) {
			ev.NextAttemptAt = ev.NotBefore
		}
		e := ev
		s.events = append(s.events, &e)
	}
	s.mu.Unlock()
	s.signal.Notify()
	return nil
}

// Rollback drops the transaction's events.
func (tx *Tx) Rollback() error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return fmt.Errorf("%w: the transaction is already committed or rolled back", core.ErrNoTransaction)
	}
	tx.done, tx.pending = true, nil
	return nil
}

// Partition returns the partition of an event among n, as the store's
// ordered claims compute it: FNV-1a of the aggregate ID, or the Seq for an
// event without one.
func Partition(ev *core.Event, n int) int {
	if ev.AggregateID == "" {
		return int(ev.Seq % int64(n))
	}
	h := fnv.New32a()
	h.Write([]byte(ev.AggregateID))
	return int(h.Sum32() % uint32(n))
}

// Claim implements core.Store: due events (unpublished, not dead, next
// attempt reached) that no open claim holds, oldest first. An ordered claim
// serves only requested partitions that no other open claim serves, and
// holds back an event while an earlier unpublished event of its aggregate
// is in backoff, held by another claim, or (under core.DeadLetterBlock)
// dead.
func (s *Store) Claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	if req.Limit <= 0 {
		return nil, fmt.Errorf("%w: claim limit %d", core.ErrInvalidOptions, req.Limit)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claimID++
	c := &claim{s: s, id: s.claimID}
	now := s.opts.Now()
	due := func(e *core.Event) bool {
		return e.PublishedAt == nil && e.DeadAt == nil && s.held[e.Seq] == nil && !e.NextAttemptAt.After(now)
	}
	o := req.Ordered
	if o == nil {
		var cands []*core.Event
		for _, e := range s.events {
			if due(e) {
				cands = append(cands, e)
			}
		}
		// Oldest first by next attempt, then Seq, as the SQL stores order.
		slices.SortStableFunc(cands, func(a, b *core.Event) int {
			if c := a.NextAttemptAt.Compare(b.NextAttemptAt); c != 0 {
				return c
			}
			return int(a.Seq - b.Seq)
		})
		for _, e := range cands[:min(len(cands), req.Limit)] {
			c.take(e)
		}
		return c, nil
	}
	if o.PartitionCount <= 0 {
		return nil, fmt.Errorf("%w: ordered claim with PartitionCount %d", core.ErrInvalidOptions, o.PartitionCount)
	}
	mine := map[int]bool{}
	for _, p := range o.Partitions {
		if p >= 0 && p < o.PartitionCount && s.parts[p] == nil {
			mine[p] = true
		}
	}
	if o.Partitions == nil {
		for p := range o.PartitionCount {
			if s.parts[p] == nil {
				mine[p] = true
			}
		}
	}
	for p := range mine {
		s.parts[p] = c
		c.parts = append(c.parts, p)
	}
	blocks := func(e *core.Event) bool {
		switch {
		case e.PublishedAt != nil:
			return false
		case e.DeadAt != nil:
			return o.DeadLetter == core.DeadLetterBlock
		}
		// A scheduled event (never attempted) holds nothing back: it
		// joins its aggregate's order when it falls due.
		return (e.AttemptCount > 0 && e.NextAttemptAt.After(now)) || (s.held[e.Seq] != nil && s.held[e.Seq] != c)
	}
	blocked := map[string]bool{} // aggregates with an earlier blocking event
	for _, e := range s.events {
		if len(c.events) == req.Limit {
			break
		}
		agg := e.AggregateID
		if agg != "" && blocked[agg] {
			continue
		}
		if mine[Partition(e, o.PartitionCount)] && due(e) {
			c.take(e)
			continue
		}
		if agg != "" && blocks(e) {
			blocked[agg] = true
		}
	}
	return c, nil
}

type claim struct {
	s      *Store
	id     int64
	events []core.Event
	parts  []int
	done   bool
}

func (c *claim) take(e *core.Event) {
	c.s.held[e.Seq] = c
	ev := *e
	ev.Payload = slices.Clone(e.Payload)
	ev.Headers = cloneHeaders(e.Headers)
	c.events = append(c.events, ev)
}

// Events implements core.Claim.
func (c *claim) Events() []core.Event { return c.events }

// Commit implements core.Claim: it records the outcome and releases the
// claim. An outcome naming an event the claim does not hold, or one event
// twice, fails with core.ErrInvalidOutcome and releases the claim
// unchanged.
func (c *claim) Commit(ctx context.Context, out core.Outcome) error {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.done {
		return core.ErrClaimDone
	}
	defer c.release()
	mine := make(map[int64]bool, len(c.events))
	for _, ev := range c.events {
		mine[ev.Seq] = true
	}
	seen := map[int64]bool{}
	check := func(seq int64) error {
		if !mine[seq] || seen[seq] {
			return fmt.Errorf("%w: seq %d is not held by this claim, or named twice", core.ErrInvalidOutcome, seq)
		}
		seen[seq] = true
		return nil
	}
	for _, seq := range out.Published {
		if err := check(seq); err != nil {
			return err
		}
	}
	for _, f := range out.Failed {
		if err := check(f.Seq); err != nil {
			return err
		}
	}
	now := s.opts.Now()
	for _, seq := range out.Published {
		e := s.find(seq)
		e.PublishedAt = &now
		e.AttemptCount++
		e.LastError = ""
	}
	for _, f := range out.Failed {
		e := s.find(f.Seq)
		e.AttemptCount++
		e.LastError = f.Err
		e.NextAttemptAt = now.Add(f.RetryIn)
		if f.Dead {
			e.DeadAt = &now
		}
	}
	return nil
}

// Release implements core.Claim.
func (c *claim) Release(ctx context.Context) error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.done {
		return core.ErrClaimDone
	}
	c.release()
	return nil
}

// release gives the claim's events and partitions back; s.mu is held.
func (c *claim) release() {
	c.done = true
	for _, ev := range c.events {
		if c.s.held[ev.Seq] == c {
			delete(c.s.held, ev.Seq)
		}
	}
	for _, p := range c.parts {
		if c.s.parts[p] == c {
			delete(c.s.parts, p)
		}
	}
}

// Crash abandons every open claim as a relay's death does: its events and
// partitions become claimable again, unmarked, and the claims' later
// Commit or Release fail with core.ErrClaimDone. A SQL store gets this from
// the database when the relay's connection dies.
func (s *Store) Crash() {
	s.mu.Lock()
	defer s.mu.Unlock()
	done := map[*claim]bool{}
	for _, c := range s.held {
		done[c] = true
	}
	for _, c := range s.parts {
		done[c] = true
	}
	for c := range done {
		c.release()
	}
}

// find returns the stored event at seq; s.mu is held.
func (s *Store) find(seq int64) *core.Event {
	i, ok := slices.BinarySearchFunc(s.events, seq, func(e *core.Event, seq int64) int { return int(e.Seq - seq) })
	if !ok {
		return nil
	}
	return s.events[i]
}

// Stats implements core.StatsReader.
func (s *Store) Stats(ctx context.Context) (core.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	st := core.Stats{ByType: map[string]core.TypeStats{}}
	for _, e := range s.events {
		if e.PublishedAt != nil {
			continue
		}
		ts := st.ByType[e.EventType]
		switch {
		case e.DeadAt != nil:
			st.Dead++
			ts.Dead++
		case e.AttemptCount == 0 && e.NextAttemptAt.After(now):
			st.Scheduled++
			ts.Scheduled++
		default:
			st.Pending++
			ts.Pending++
			due := e.CreatedAt
			if e.AttemptCount == 0 {
				due = e.NextAttemptAt
			}
			age := now.Sub(due)
			if st.OldestPending.IsZero() || due.Before(st.OldestPending) {
				st.OldestPending, st.OldestPendingAge = due, age
			}
			ts.OldestPendingAge = max(ts.OldestPendingAge, age)
		}
		st.ByType[e.EventType] = ts
	}
	return st, nil
}

// DeletePublished implements core.Cleaner: at most limit events published
// before the given time, oldest published first.
func (s *Store) DeletePublished(ctx context.Context, before time.Time, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("%w: delete limit %d", core.ErrInvalidOptions, limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var old []*core.Event
	for _, e := range s.events {
		if e.PublishedAt != nil && e.PublishedAt.Before(before) {
			old = append(old, e)
		}
	}
	slices.SortStableFunc(old, func(a, b *core.Event) int { return a.PublishedAt.Compare(*b.PublishedAt) })
	old = old[:min(len(old), limit)]
	gone := make(map[int64]bool, len(old))
	for _, e := range old {
		gone[e.Seq] = true
	}
	s.events = slices.DeleteFunc(s.events, func(e *core.Event) bool { return gone[e.Seq] })
	return int64(len(old)), nil
}

// Get returns the stored event with the given ID, with its bookkeeping, or
// an error wrapping core.ErrEventNotFound.
func (s *Store) Get(ctx context.Context, id string) (core.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.events {
		if e.ID == id {
			return cloneEvent(e), nil
		}
	}
	return core.Event{}, fmt.Errorf("%w: event %s", core.ErrEventNotFound, id)
}

// Events returns a copy of every stored event, in Seq order.
func (s *Store) Events() []core.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]core.Event, len(s.events))
	for i, e := range s.events {
		out[i] = cloneEvent(e)
	}
	return out
}

// Backdate moves the timestamps of the event with the given ID (created,
// published, next attempt, dead) back by age, so that tests of retention,
// lag and backoff need not wait.
func (s *Store) Backdate(ctx context.Context, id string, age time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.events {
		if e.ID == id {
			e.CreatedAt = e.CreatedAt.Add(-age)
			e.NextAttemptAt = e.NextAttemptAt.Add(-age)
			for _, p := range []**time.Time{&e.PublishedAt, &e.DeadAt} {
				if *p != nil {
					t := (*p).Add(-age)
					*p = &t
				}
			}
			return nil
		}
	}
	return fmt.Errorf("%w: event %s", core.ErrEventNotFound, id)
}

// RetryDead re-queues the dead events with the given IDs (every dead event
// when none is given) with a fresh budget of attempts, due now, and returns
// how many it re-queued.
func (s *Store) RetryDead(ctx context.Context, ids ...string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	var n int64
	for _, e := range s.events {
		if e.DeadAt != nil && (len(ids) == 0 || slices.Contains(ids, e.ID)) {
			e.DeadAt, e.AttemptCount, e.NextAttemptAt = nil, 0, now
			n++
		}
	}
	if n > 0 {
		s.signal.Notify()
	}
	return n, nil
}

func cloneEvent(e *core.Event) core.Event {
	ev := *e
	ev.Payload = slices.Clone(e.Payload)
	ev.Headers = cloneHeaders(e.Headers)
	return ev
}

func cloneHeaders(h map[string]string) map[string]string {
	if h == nil {
		return nil
	}
	out := make(map[string]string, len(h))
	for k, v := range h {
		out[k] = v
	}
	return out
}
