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

// Bounds of the size options of RelayOptions: a larger value is a mistake
// (--batch-size 2000000000 would allocate for two billion events), refused
// with an error wrapping ErrInvalidOptions.
const (
	MaxBatchSize      = 10_000
	MaxConcurrency    = 256
	MaxErrorLengthMax = 64 << 10
)

// RelayOptions configures a Relay. Zero fields take their defaults.
type RelayOptions struct {
	// BatchSize is how many events one claim takes. Default 100, at most
	// MaxBatchSize.
	BatchSize int
	// PollInterval is how long an idle worker waits before claiming again
	// when nothing woke it. Default 1s.
	PollInterval time.Duration
	// Cooldown is the least time from the start of one claim of a worker to
	// the start of its next when the first was not a full batch. It bounds
	// how often a worker woken by every commit of busy producers claims, so
	// that it takes a few events per claim instead of one, which costs the
	// database (and so the producers) much less, for at most Cooldown of
	// latency. A full batch is followed at once. Default 1ms; negative
	// disables it.
	Cooldown time.Duration
	// MaxCooldown is how far a worker stretches its Cooldown while its
	// claims keep finding only a few events each: under a steady trickle
	// of commits, each of which wakes the relay, the wait doubles from
	// Cooldown up to MaxCooldown, so that one claim gathers what several
	// commits wrote (a claim per event costs the database two to three
	// times the work of a claim per few events). It shrinks back as claims
	// fill up, and a claim that finds nothing resets it, so that the first
	// event after a quiet spell is claimed at once. Default 5ms; set it to
	// Cooldown to claim on every wake-up.
	MaxCooldown time.Duration
	// Concurrency is the number of workers, each with its own claim.
	// Default 1, at most MaxConcurrency; capped by the store's
	// StoreCapabilities.MaxConcurrency.
	Concurrency int
	// Retry decides backoff and dead-lettering.
	Retry RetryPolicy
	// ShutdownTimeout bounds how long a batch in flight may take to finish
	// after Run's context is cancelled. Default 10s. A batch cut off by it
	// is released unmarked and published again later.
	ShutdownTimeout time.Duration
	// PublishTimeout bounds the publishing of one batch: the context given
	// to the Publisher is cancelled after it, and the events it had not
	// sent by then are recorded as failed (wrapping ErrPublishTimeout) and
	// retried after their backoff, so that a hung broker connection holds
	// neither the claim's rows nor, in ordered mode, the relay's partitions
	// for longer. A publisher that ignores its context cannot be cut off;
	// the relay logs a warning when one overruns. Default 30s; negative
	// disables it.
	PublishTimeout time.Duration
	// MaxErrorLength bounds the stored LastError. Default 2000 bytes, at
	// most MaxErrorLengthMax.
	MaxErrorLength int
	// Logger receives the relay's structured logs. Default slog.Default().
	Logger *slog.Logger
	// Ordering selects per-aggregate ordering (see docs/ordering.md).
	// Default OrderingAuto: ordered when the publisher's broker keeps
	// per-key order (Kafka, SNS FIFO).
	Ordering OrderingMode
	// Ordered configures ordered mode: the partition leaser shared with
	// other relays, and the dead-letter policy.
	Ordered OrderedOptions
}

func (o RelayOptions) withDefaults() (RelayOptions, error) {
	if o.BatchSize < 0 || o.PollInterval < 0 || o.Concurrency < 0 || o.ShutdownTimeout < 0 || o.MaxErrorLength < 0 {
		return o, fmt.Errorf("%w: negative BatchSize, PollInterval, Concurrency, ShutdownTimeout or MaxErrorLength", ErrInvalidOptions)
	}
	if o.BatchSize > MaxBatchSize {
		return o, fmt.Errorf("%w: BatchSize %d is above the limit of %d", ErrInvalidOptions, o.BatchSize, MaxBatchSize)
	}
	if o.Concurrency > MaxConcurrency {
		return o, fmt.Errorf("%w: Concurrency %d is above the limit of %d", ErrInvalidOptions, o.Concurrency, MaxConcurrency)
	}
	if o.MaxErrorLength > MaxErrorLengthMax {
		return o, fmt.Errorf("%w: MaxErrorLength %d is above the limit of %d", ErrInvalidOptions, o.MaxErrorLength, MaxErrorLengthMax)
	}
	if err := o.Retry.validate(); err != nil {
		return o, err
	}
	if o.BatchSize == 0 {
		o.BatchSize = 100
	}
	if o.PollInterval == 0 {
		o.PollInterval = time.Second
	}
	switch {
	case o.Cooldown == 0:
		o.Cooldown = time.Millisecond
	case o.Cooldown < 0:
		o.Cooldown = 0
	}
	switch {
	case o.MaxCooldown < 0:
		return o, fmt.Errorf("%w: negative MaxCooldown", ErrInvalidOptions)
	case o.MaxCooldown == 0:
		o.MaxCooldown = max(DefaultMaxCooldown, o.Cooldown)
	case o.MaxCooldown < o.Cooldown:
		return o, fmt.Errorf("%w: MaxCooldown %v below Cooldown %v", ErrInvalidOptions, o.MaxCooldown, o.Cooldown)
	}
	if o.Concurrency == 0 {
		o.Concurrency = 1
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 10 * time.Second
	}
	switch {
	case o.PublishTimeout == 0:
		o.PublishTimeout = 30 * time.Second
	case o.PublishTimeout < 0:
		o.PublishTimeout = 0
	}
	if o.MaxErrorLength == 0 {
		o.MaxErrorLength = 2000
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Retry = o.Retry.withDefaults()
	return o, nil
}

// RelayCounters are running totals of a Relay, for logs and tests.
type RelayCounters struct {
	Batches      int64 // claims that returned at least one event
	Published    int64 // events the broker accepted
	Failed       int64 // failed attempts, dead-lettering ones included
	DeadLettered int64 // events that exhausted their attempts
	Released     int64 // events given back unmarked (shutdown cut a batch off)
}

// BatchResult describes one claimed and processed batch.
type BatchResult struct {
	Claimed      int
	Published    int
	Failed       int
	DeadLettered int
	// idle: an ordered worker held no partition, so the store was not
	// asked; such a pass says nothing of the store's health.
	idle bool
}

// Relay moves events from a Store to a Publisher: it claims due events in
// batches, publishes them and records each event's outcome.
//
// A failed publish never fails its batch: the event is retried after a
// backoff with jitter, and dead-lettered after RetryPolicy.MaxAttempts.
type Relay struct {
	store   Store
	caps    StoreCapabilities
	pub     Publisher
	opts    RelayOptions
	log     *slog.Logger
	wake    chan struct{}
	ordered bool // resolved from opts.Ordering at NewRelay
	running atomic.Bool

	batches, published, failed, dead, released atomic.Int64

	// brokerDown and storeDown turn a dependency's outage into two log
	// lines (down, back) instead of one per batch or per event.
	brokerDown, storeDown atomic.Bool
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
	ordered, err := resolveOrdering(&o, caps, pub.Capabilities())
	if err != nil {
		return nil, err
	}
	return &Relay{store: store, caps: caps, pub: pub, opts: o, log: o.Logger, wake: make(chan struct{}, 1), ordered: ordered}, nil
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
// (StoreCapabilities.Wakeups); if the producer's transaction has not
// committed yet when the worker claims, the worker looks again a few times
// within milliseconds before it goes back to polling.
func (r *Relay) Notify() {
	select {
	case r.wake <- struct{}{}:
	default:
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
	if r.caps.Wakeups != nil {
		defer r.caps.Wakeups.Subscribe(r.Notify)()
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
	for {
		start := time.Now()
		res, err := r.processBatch(ctx, worker)
		if err == nil {
			cooldown = r.nextCooldown(cooldown, res.Claimed)
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrNotMigrated) {
			log.Error("txoutbox: relay stopped", "error", err)
			return err
		}
		if err != nil || !res.idle {
			// A worker without partitions did not reach the store: it must
			// not announce the store back (its leases may have lapsed
			// because the store is down).
			r.storeState(err, log)
		}
		var wait time.Duration
		switch {
		case err != nil:
			errWait = min(max(2*errWait, 100*time.Millisecond), 5*time.Second, r.opts.PollInterval)
			wait = errWait
		case res.Claimed == r.opts.BatchSize:
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
			wait = r.opts.PollInterval
		case grace < len(wakeGrace):
			wait = wakeGrace[grace]
			grace++
		default:
			errWait = 0
			wait = r.opts.PollInterval
		}
		if err == nil {
			wait = max(wait, cooldown-time.Since(start))
		}
		if !r.sleep(ctx, timer, wait, &grace) {
			return nil
		}
		if err == nil {
			// A Notify may have cut the wait short: the cooldown still
			// holds, and the Notifies during it coalesce into this claim.
			if rest := cooldown - time.Since(start); rest > 0 && !r.sleep(ctx, timer, rest, nil) {
				return nil
			}
		}
	}
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

// sleep waits for d, a Notify (which restarts the wake grace, when grace is
// not nil) or ctx; it reports false if ctx ended.
func (r *Relay) sleep(ctx context.Context, timer *time.Timer, d time.Duration, grace *int) bool {
	timer.Reset(d)
	defer func() {
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}()
	wake := r.wake
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

// ProcessBatch claims one batch, publishes it and records the outcome. It is
// what each worker of Run does in a loop; tests and tools call it directly.
// If ctx is cancelled after the claim, the batch still finishes within
// ShutdownTimeout.
//
// In ordered mode the batch comes from the partitions the relay holds (all
// of its workers' partitions) and is published in aggregate order.
func (r *Relay) ProcessBatch(ctx context.Context) (BatchResult, error) {
	return r.processBatch(ctx, -1)
}

func (r *Relay) processBatch(ctx context.Context, worker int) (BatchResult, error) {
	if err := ctx.Err(); err != nil {
		return BatchResult{}, err
	}
	req := ClaimRequest{Limit: r.opts.BatchSize}
	if r.ordered {
		oc, ok := r.orderedRequest(worker)
		if !ok {
			return BatchResult{idle: true}, nil // no partitions held (yet)
		}
		req.Ordered = oc
	}
	claim, err := r.store.Claim(ctx, req)
	if err != nil {
		return BatchResult{}, fmt.Errorf("txoutbox: claim: %w", err)
	}
	events := claim.Events()
	if len(events) == 0 {
		return BatchResult{}, r.release(claim)
	}
	r.batches.Add(1)

	// The batch outlives a cancelled ctx by at most ShutdownTimeout, so that
	// a shutdown does not turn a successful publish into a duplicate.
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.opts.ShutdownTimeout, cancel)
		context.AfterFunc(bctx, func() { t.Stop() })
	})
	defer stop()

	var (
		out Outcome
		res BatchResult
		rep batchReport
		cut bool
	)
	if r.ordered {
		out, res, rep, cut = r.publishOrdered(bctx, events)
	} else {
		pctx, done := r.publishContext(bctx, len(events))
		pubErr := r.publish(pctx, events)
		timedOut := done()
		cut = bctx.Err() != nil
		if !cut {
			out, res, rep = r.outcome(events, pubErr, timedOut)
		}
	}
	if cut {
		// Cut off by shutdown: outcomes are unknown, so mark nothing.
		r.released.Add(int64(len(events)))
		r.log.Warn("txoutbox: shutdown cut a batch off; it will be published again", "events", len(events))
		return BatchResult{Claimed: len(events)}, r.release(claim)
	}
	if err := claim.Commit(bctx, out); err != nil {
		// Published but not marked: the claim is gone with its transaction,
		// so the batch is published again. The inbox absorbs the duplicates.
		return BatchResult{Claimed: len(events)}, fmt.Errorf("txoutbox: record outcome of %d events: %w", len(events), err)
	}
	r.logBatch(res, rep)
	r.published.Add(int64(res.Published))
	r.failed.Add(int64(res.Failed))
	r.dead.Add(int64(res.DeadLettered))
	return res, nil
}

func (r *Relay) release(c Claim) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.ShutdownTimeout)
	defer cancel()
	if err := c.Release(ctx); err != nil && !errors.Is(err, ErrClaimDone) {
		return fmt.Errorf("txoutbox: release claim: %w", err)
	}
	return nil
}

// publish calls the publisher and turns a panic into an error of the batch,
// so that a buggy publisher cannot take the relay down.
func (r *Relay) publish(ctx context.Context, events []Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("txoutbox: publisher panicked: %v", p)
		}
	}()
	return r.pub.Publish(ctx, events)
}

// publishContext returns the context a batch of n events is published with
// (ctx bounded by PublishTimeout) and a function to call once the publisher
// returned, which reports whether the timeout had run out.
func (r *Relay) publishContext(ctx context.Context, n int) (context.Context, func() bool) {
	d := r.opts.PublishTimeout
	if d <= 0 {
		return ctx, func() bool { return false }
	}
	pctx, cancel := context.WithTimeoutCause(ctx, d, ErrPublishTimeout)
	start := time.Now()
	// A publisher should return soon after its context ends; one that does
	// not holds the claim regardless, and the operator should hear of it.
	overrun := time.AfterFunc(d+time.Second+d/2, func() {
		r.log.Warn("txoutbox: publisher has not returned long after its context ended; it ignores the context, and the batch's rows stay locked until it returns",
			"events", n, "publish_timeout", d, "running_for", time.Since(start).Round(time.Millisecond))
	})
	return pctx, func() bool {
		overrun.Stop()
		timedOut := publishTimedOut(pctx)
		cancel()
		return timedOut
	}
}

// publishTimedOut reports whether pctx, from publishContext, ended because
// PublishTimeout ran out (not because the relay is shutting down).
func publishTimedOut(pctx context.Context) bool {
	return errors.Is(context.Cause(pctx), ErrPublishTimeout)
}

// batchReport gathers what the relay logs about one batch's failures, so
// that a batch writes one line, not one per event.
type batchReport struct {
	failed, dead, permanent int
	first                   *Event
	firstErr                string
	firstRetry              time.Duration
	deadIDs                 []string
}

func (b *batchReport) add(ev *Event, f Failure, permanent bool) {
	b.failed++
	if permanent {
		b.permanent++
	}
	if f.Dead {
		b.dead++
		if len(b.deadIDs) < 10 {
			b.deadIDs = append(b.deadIDs, ev.ID)
		}
	}
	if b.first == nil {
		b.first, b.firstErr, b.firstRetry = ev, f.Err, f.RetryIn
	}
}

func (b *batchReport) merge(o batchReport) {
	if b.first == nil {
		b.first, b.firstErr, b.firstRetry = o.first, o.firstErr, o.firstRetry
	}
	b.failed += o.failed
	b.dead += o.dead
	b.permanent += o.permanent
	b.deadIDs = append(b.deadIDs, o.deadIDs[:min(len(o.deadIDs), max(10-len(b.deadIDs), 0))]...)
}

// log writes the batch's failures as at most two lines, and the broker's
// state changes: a batch that published nothing and failed for reasons that
// pass marks the broker down; one that published something marks it back.
func (r *Relay) logBatch(res BatchResult, b batchReport) {
	switch {
	case res.Published > 0:
		if r.brokerDown.CompareAndSwap(true, false) {
			r.log.Info("txoutbox: the broker takes events again")
		}
	case b.failed > b.permanent:
		if r.brokerDown.CompareAndSwap(false, true) {
			r.log.Warn("txoutbox: the broker took no event of the batch; retrying with backoff (logged once until it takes events again)",
				"events", res.Claimed, "first_error", b.firstErr)
		}
	}
	if b.first == nil {
		return
	}
	attrs := []any{"failed", b.failed, "claimed", res.Claimed,
		"first_event_id", b.first.ID, "first_event_type", b.first.EventType, "first_error", b.firstErr}
	if b.failed > b.dead {
		if r.brokerDown.Load() && res.Published == 0 {
			r.log.Debug("txoutbox: publish failed; will retry", append(attrs, "retry_in", b.firstRetry)...)
		} else {
			r.log.Warn("txoutbox: publish failed; will retry", append(attrs, "retry_in", b.firstRetry)...)
		}
	}
	if b.dead > 0 {
		r.log.Error("txoutbox: events dead-lettered (kept; re-queue with txoutbox dead retry)",
			"dead_lettered", b.dead, "permanent", b.permanent, "event_ids", b.deadIDs, "first_error", b.firstErr)
	}
}

// outcome turns the publisher's error into the outcome of events: an error
// marked Permanent dead-letters its event at once; any other is retried
// after its backoff until the attempts run out.
func (r *Relay) outcome(events []Event, pubErr error, timedOut bool) (Outcome, BatchResult, batchReport) {
	errs := EventErrors(pubErr, len(events))
	if timedOut {
		for i, err := range errs {
			if errors.Is(err, context.DeadlineExceeded) {
				errs[i] = fmt.Errorf("%w after %s: %w", ErrPublishTimeout, r.opts.PublishTimeout, err)
			}
		}
	}
	res := BatchResult{Claimed: len(events)}
	var rep batchReport
	out := Outcome{Published: make([]int64, 0, len(events))}
	for i := range events {
		ev := &events[i]
		if errs[i] == nil {
			out.Published = append(out.Published, ev.Seq)
			continue
		}
		attempts := ev.AttemptCount + 1
		permanent := IsPermanent(errs[i])
		f := Failure{
			Seq:     ev.Seq,
			Err:     truncateError(errs[i], r.opts.MaxErrorLength),
			RetryIn: r.opts.Retry.Backoff(attempts),
			Dead:    permanent || r.opts.Retry.Exhausted(attempts),
		}
		out.Failed = append(out.Failed, f)
		res.Failed++
		if f.Dead {
			res.DeadLettered++
		}
		rep.add(ev, f, permanent)
		r.log.Debug("txoutbox: publish failed", "event_id", ev.ID, "seq", ev.Seq, "event_type", ev.EventType,
			"aggregate_id", ev.AggregateID, "attempt", attempts, "dead", f.Dead, "permanent", permanent, "error", f.Err)
	}
	res.Published = len(out.Published)
	return out, res, rep
}

// Drain processes batches until a claim comes back empty or ctx ends, and
// returns the totals. It is meant for tests, tools and benchmarks; events
// that are in backoff are not waited for.
func (r *Relay) Drain(ctx context.Context) (BatchResult, error) {
	var total BatchResult
	for {
		res, err := r.ProcessBatch(ctx)
		total.Claimed += res.Claimed
		total.Published += res.Published
		total.Failed += res.Failed
		total.DeadLettered += res.DeadLettered
		if err != nil || res.Claimed == 0 {
			return total, err
		}
	}
}
