package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// RelayCounters count what a Relay did: its running totals
// (Relay.Counters), one batch (ProcessBatch) or one Drain. A batch whose
// outcome could not be recorded counts as claimed only: it is claimed and
// published again.
type RelayCounters struct {
	Batches      int64 // claims that returned at least one event
	Claimed      int64 // events those claims returned
	Published    int64 // events the broker accepted
	Failed       int64 // failed attempts, dead-lettering ones included
	DeadLettered int64 // events that exhausted their attempts
	Released     int64 // events given back unmarked (shutdown cut a batch off)
}

// add adds o to c.
func (c *RelayCounters) add(o RelayCounters) {
	c.Batches += o.Batches
	c.Claimed += o.Claimed
	c.Published += o.Published
	c.Failed += o.Failed
	c.DeadLettered += o.DeadLettered
	c.Released += o.Released
}

// Relay moves events from a Store to a Publisher: it claims due events in
// batches, publishes them and records each event's outcome.
//
// A failed publish never fails its batch: the event is retried after a
// backoff with jitter, and dead-lettered after RetryPolicy.MaxAttempts.
type Relay struct {
	store Store
	caps  StoreCapabilities
	// wakeups and nextDue are the store's optional WakeupSource and
	// NextDueReader, found at NewRelay (nil when it has none).
	wakeups *Signal
	nextDue NextDueReader
	pub     Publisher
	opts    RelayOptions
	log     *slog.Logger
	// wakes are the workers' wake-ups: one channel shared by all, which a
	// Notify gives to one idle worker, or, in ordered mode with the
	// partitions split among several workers, one per worker, since one
	// worker cannot claim another's partitions and a Notify must reach
	// them all.
	wakes   []chan struct{}
	ordered bool // resolved from opts.Ordering at NewRelay
	running atomic.Bool

	batches, claimed, published, failed, dead, released atomic.Int64

	// brokerDown and storeDown turn a dependency's outage into two log
	// lines (down, back) instead of one per batch or per event.
	brokerDown, storeDown atomic.Bool
	brokerLog             brokerLog
}

// NewRelay returns a relay from store to pub. It reads both capabilities:
// the store's concurrency limit caps Concurrency; ordered mode is decided
// from Ordering and the publisher's order guarantee (and fails with
// ErrOrderedUnsupported when the store cannot keep it); the store's leaser
// and its wake-up signal are used without further wiring.
func NewRelay(store Store, pub Publisher, opts RelayOptions) (*Relay, error) {
	if store == nil || pub == nil {
		return nil, fmt.Errorf("%w: NewRelay needs a Store and a Publisher", ErrInvalidOptions)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	caps := store.Capabilities()
	if max := caps.MaxConcurrency; max > 0 && o.Concurrency > max {
		o.Logger.Info("txoutbox: relay concurrency capped by store", "asked", o.Concurrency, "max", max)
		o.Concurrency = max
	}
	ordered, err := resolveOrdering(&o, store, caps, pub.Capabilities())
	if err != nil {
		return nil, err
	}
	n := 1
	if ordered && caps.OrderedPartitions {
		n = o.Concurrency
	}
	wakes := make([]chan struct{}, n)
	for i := range wakes {
		wakes[i] = make(chan struct{}, 1)
	}
	r := &Relay{store: store, caps: caps, pub: pub, opts: o, log: o.Logger, wakes: wakes, ordered: ordered}
	if ws, ok := StoreAs[WakeupSource](store); ok {
		r.wakeups = ws.Wakeups()
	}
	r.nextDue, _ = StoreAs[NextDueReader](store)
	return r, nil
}

// Ordered reports whether the relay runs in ordered mode.
func (r *Relay) Ordered() bool { return r.ordered }

// Leaser returns the partition leaser of ordered mode (the one given in
// RelayOptions.Ordered or the store's), or nil.
func (r *Relay) Leaser() PartitionLeaser {
	if !r.ordered {
		return nil
	}
	return r.opts.Ordered.Leaser
}

// Options returns the relay's options with defaults applied.
func (r *Relay) Options() RelayOptions { return r.opts }

// Notify wakes an idle worker at once instead of at the next poll. It never
// blocks, and calls that come faster than the relay claims are coalesced.
// A running relay is notified by its store's adapter after every write
// (WakeupSource); if the producer's transaction has not
// committed yet when the worker claims, the worker looks again a few times
// within milliseconds before it goes back to polling.
func (r *Relay) Notify() {
	for _, w := range r.wakes {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// RelayHealth is what a relay knows of its dependencies: whether the
// latest batches failed for want of the broker or of the store. Each turns
// true with the relay's "down" log line and false with its "back" line.
type RelayHealth struct {
	// BrokerDown: the broker took no event of the latest batch that
	// reached it.
	BrokerDown bool
	// StoreDown: the latest batch failed at the store (claim or mark).
	StoreDown bool
}

// Health reports the relay's view of its dependencies (for metrics and
// health checks).
func (r *Relay) Health() RelayHealth {
	return RelayHealth{BrokerDown: r.brokerDown.Load(), StoreDown: r.storeDown.Load()}
}

// Counters returns the running totals.
func (r *Relay) Counters() RelayCounters {
	return RelayCounters{
		Batches:      r.batches.Load(),
		Claimed:      r.claimed.Load(),
		Published:    r.published.Load(),
		Failed:       r.failed.Load(),
		DeadLettered: r.dead.Load(),
		Released:     r.released.Load(),
	}
}

// Run runs the workers until ctx is cancelled, then lets batches in flight
// finish (within ShutdownTimeout) and returns nil. Errors that pass (the
// database or the broker down) are logged when they start and when they
// end, and retried; an error that retrying cannot cure (ErrNotMigrated: the
// table does not exist) stops the workers and is returned. While it runs,
// the relay is subscribed to its store's wake-up signal. In ordered mode Run
// also runs the PartitionLeaser, releasing the leases after the last batch;
// if the leaser fails, Run stops the workers and returns its error. Run may
// be called again after it returned, but not concurrently.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Relay.Run is already running", ErrInvalidOptions)
	}
	defer r.running.Store(false)
	if r.wakeups != nil {
		defer r.wakeups.Subscribe(r.Notify)()
	}
	var leaser PartitionLeaser
	if r.ordered {
		leaser = r.opts.Ordered.Leaser
	}
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	var fatalOnce sync.Once
	var fatal error
	fail := func(err error) {
		fatalOnce.Do(func() {
			fatal = err
			stopWorkers()
		})
	}
	lctx, stopLeaser := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLeaser()
	leaserDone := make(chan error, 1)
	if leaser != nil {
		go func() {
			err := leaser.Run(lctx)
			if err != nil {
				stopWorkers()
			}
			leaserDone <- err
		}()
	}
	defer r.brokerLog.flush(r.log)
	var wg sync.WaitGroup
	for i := range r.opts.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.work(wctx, i, r.log.With("worker", i)); err != nil {
				fail(err)
			}
		}()
	}
	wg.Wait()
	if leaser == nil {
		return fatal
	}
	// The leases go only after the last batch: handing a partition over
	// while its batch is in flight would be safe (the store fences claims)
	// but would make the successor wait.
	stopLeaser()
	if err := <-leaserDone; err != nil && fatal == nil {
		return fmt.Errorf("txoutbox: partition leaser: %w", err)
	}
	return fatal
}

// wakeGrace are the waits after a Notify whose claim found nothing: the
// notifying transaction is usually a fraction of a millisecond from its
// commit, but a loaded machine can stretch that, so the waits double up to a
// quarter second before the worker falls back to polling.
var wakeGrace = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 8 * time.Millisecond,
	16 * time.Millisecond, 32 * time.Millisecond, 64 * time.Millisecond, 128 * time.Millisecond,
}

// DefaultMaxCooldown is RelayOptions.MaxCooldown's default.
const DefaultMaxCooldown = 5 * time.Millisecond

// coalesceTarget is the number of events per claim below which a worker
// stretches its cooldown (RelayOptions.MaxCooldown).
const coalesceTarget = 8

// nextCooldown returns the cooldown to keep after a claim of claimed
// events, given the current one.
func (r *Relay) nextCooldown(cur time.Duration, claimed int) time.Duration {
	switch {
	case claimed == 0:
		return r.opts.Cooldown
	case claimed < coalesceTarget:
		return min(max(2*cur, r.opts.Cooldown, time.Millisecond), r.opts.MaxCooldown)
	default:
		return max(cur/2, r.opts.Cooldown)
	}
}

// work is one worker's loop. It returns an error that retrying cannot
// cure, and nil when ctx ends.
func (r *Relay) work(ctx context.Context, worker int, log *slog.Logger) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	errWait := time.Duration(0)
	grace := len(wakeGrace) // no grace until woken
	cooldown := r.opts.Cooldown
	leaseWait := time.Duration(0)
	for {
		start := time.Now()
		res, idle, err := r.processBatch(ctx, worker)
		if err == nil {
			cooldown = r.nextCooldown(cooldown, int(res.Claimed))
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrNotMigrated) {
			log.Error("txoutbox: relay stopped", "error", err)
			return err
		}
		if err != nil || !idle {
			// A worker without partitions did not reach the store: it must
			// not announce the store back (its leases may have lapsed
			// because the store is down).
			r.storeState(err, log)
		}
		var wait time.Duration
		if err != nil || !idle {
			leaseWait = 0
		}
		switch {
		case err == nil && idle:
			// No partition held yet (the leaser is still acquiring, or
			// another relay holds them all): look again soon, not after
			// the poll interval. The leaser wakes no worker when it
			// gains a partition, and a Notify that came meanwhile found
			// none either: events committed then would wait a whole
			// poll. The check reads the leaser's state, not the store.
			leaseWait = min(max(2*leaseWait, 50*time.Millisecond), time.Second, r.opts.PollInterval)
			wait = leaseWait
		case err != nil:
			errWait = min(max(2*errWait, 100*time.Millisecond), 5*time.Second, r.opts.PollInterval)
			wait = errWait
		case res.Claimed == int64(r.opts.BatchSize):
			errWait = 0
			continue // a full batch: more is probably waiting
		case res.Claimed > 0 && grace < len(wakeGrace):
			// Woken and busy: events notified before this claim may not
			// have been committed in time for it, so look again soon even
			// if no further Notify comes.
			errWait = 0
			grace = 1
			wait = wakeGrace[0]
		case res.Claimed > 0:
			errWait = 0
			wait = r.untilDue(ctx, log)
		case grace < len(wakeGrace):
			wait = wakeGrace[grace]
			grace++
		default:
			errWait = 0
			wait = r.untilDue(ctx, log)
		}
		if err == nil {
			wait = max(wait, cooldown-time.Since(start))
		}
		if !r.sleep(ctx, timer, r.wakes[worker%len(r.wakes)], wait, &grace) {
			return nil
		}
		if err == nil {
			// A Notify may have cut the wait short: the cooldown still
			// holds, and the Notifies during it coalesce into this claim.
			if rest := cooldown - time.Since(start); rest > 0 && !r.sleep(ctx, timer, nil, rest, nil) {
				return nil
			}
		}
	}
}

// untilDue is an idle worker's wait: the poll interval, or less when the
// store knows that an event falls due sooner (a scheduled event, the end
// of a backoff). A store that cannot tell, or fails to, leaves the poll.
func (r *Relay) untilDue(ctx context.Context, log *slog.Logger) time.Duration {
	wait := r.opts.PollInterval
	if r.nextDue == nil {
		return wait
	}
	d, ok, err := r.nextDue.NextDue(ctx)
	if err != nil {
		if ctx.Err() == nil {
			log.Debug("txoutbox: relay could not read when the next event falls due; polling", "error", err)
		}
		return wait
	}
	if ok && d < wait {
		return d
	}
	return wait
}

// storeState logs the start and the end of a run of failed batches once
// each, so that a database outage writes two lines, not one a second.
func (r *Relay) storeState(err error, log *slog.Logger) {
	if err == nil {
		if r.storeDown.CompareAndSwap(true, false) {
			log.Info("txoutbox: relay batches succeed again")
		}
		return
	}
	if r.storeDown.CompareAndSwap(false, true) {
		log.Error("txoutbox: relay batch failed; retrying with backoff until it succeeds (logged once)", "error", err)
		return
	}
	log.Debug("txoutbox: relay batch failed again", "error", err)
}

// sleep waits for d, a Notify on wake (which restarts the wake grace, when
// grace is not nil) or ctx; it reports false if ctx ended.
func (r *Relay) sleep(ctx context.Context, timer *time.Timer, wake chan struct{}, d time.Duration, grace *int) bool {
	timer.Reset(d)
	defer func() {
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}()
	if grace == nil {
		wake = nil // the cooldown: a Notify stays pending for after it
	}
	select {
	case <-ctx.Done():
		return false
	case <-wake:
		*grace = 0
	case <-timer.C:
	}
	return true
}
