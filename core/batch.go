package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// ProcessBatch claims one batch, publishes it and records the outcome. It is
// what each worker of Run does in a loop; tests and tools call it directly.
// If ctx is cancelled after the claim, the batch still finishes within
// ShutdownTimeout.
//
// In ordered mode the batch comes from the partitions the relay holds (all
// of its workers' partitions) and is published in aggregate order.
func (r *Relay) ProcessBatch(ctx context.Context) (RelayCounters, error) {
	res, _, err := r.processBatch(ctx, -1)
	return res, err
}

// processBatch is ProcessBatch for one worker (-1: all of the relay's
// partitions). idle: an ordered worker held no partition, so the store was
// not asked; such a pass says nothing of the store's health.
func (r *Relay) processBatch(ctx context.Context, worker int) (res RelayCounters, idle bool, err error) {
	if err := ctx.Err(); err != nil {
		return RelayCounters{}, false, err
	}
	req := ClaimRequest{Limit: r.opts.BatchSize}
	if r.ordered {
		oc, ok := r.orderedRequest(worker)
		if !ok {
			return RelayCounters{}, true, nil // no partitions held (yet)
		}
		req.Ordered = oc
	}
	claim, err := r.store.Claim(ctx, req)
	if err != nil {
		return RelayCounters{}, false, fmt.Errorf("txoutbox: claim: %w", err)
	}
	events := claim.Events()
	if len(events) == 0 {
		return RelayCounters{}, false, r.release(claim)
	}
	claimed := RelayCounters{Batches: 1, Claimed: int64(len(events))}
	r.batches.Add(1)
	r.claimed.Add(claimed.Claimed)

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
		claimed.Released = claimed.Claimed
		return claimed, false, r.release(claim)
	}
	if err := claim.Commit(bctx, out); err != nil {
		// Published but not marked: the claim is gone with its transaction,
		// so the batch is published again. The inbox absorbs the duplicates.
		return claimed, false, fmt.Errorf("txoutbox: record outcome of %d events: %w", len(events), err)
	}
	res.Batches = 1
	r.logBatch(res, rep)
	r.published.Add(res.Published)
	r.failed.Add(res.Failed)
	r.dead.Add(res.DeadLettered)
	return res, false, nil
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
func (r *Relay) logBatch(res RelayCounters, b batchReport) {
	switch {
	case res.Published > 0:
		r.brokerDown.Store(false)
		r.brokerLog.up(r.log)
	case b.failed > b.permanent:
		r.brokerDown.Store(true)
		r.brokerLog.down(r.log, int(res.Claimed), b.firstErr)
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
func (r *Relay) outcome(events []Event, pubErr error, timedOut bool) (Outcome, RelayCounters, batchReport) {
	errs := EventErrors(pubErr, len(events))
	if timedOut {
		for i, err := range errs {
			if errors.Is(err, context.DeadlineExceeded) {
				errs[i] = fmt.Errorf("%w after %s: %w", ErrPublishTimeout, r.opts.PublishTimeout, err)
			}
		}
	}
	res := RelayCounters{Claimed: int64(len(events))}
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
	res.Published = int64(len(out.Published))
	return out, res, rep
}

// Drain processes batches until a claim comes back empty or ctx ends, and
// returns the totals. It is meant for tests, tools and benchmarks; events
// that are in backoff are not waited for. Outside ordered mode it runs
// Concurrency workers, each until its own claim comes back empty, as Run
// would; in ordered mode one batch at a time covers every partition. The
// first error cancels the other workers and is returned.
func (r *Relay) Drain(ctx context.Context) (RelayCounters, error) {
	defer r.brokerLog.flush(r.log)
	workers := r.opts.Concurrency
	if r.ordered || workers < 1 {
		workers = 1
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		total    RelayCounters
		firstErr error
		wg       sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				res, err := r.ProcessBatch(ctx)
				mu.Lock()
				total.add(res)
				if err != nil && firstErr == nil {
					firstErr = err
					cancel()
				}
				mu.Unlock()
				if err != nil || res.Claimed == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	return total, firstErr
}

// brokerSettle is how long the broker must take events without a failure
// before the relay announces it back. A flapping broker (Kafka's circuit
// breaker half-open after connection resets lets a batch through, then
// opens again) is then one outage in the log, not a pair of lines a
// second.
const brokerSettle = 2 * time.Second

// brokerLog announces the broker's outages: one line when it starts, one
// when the broker has taken events for brokerSettle since the last
// failure (or when the relay stops after a success).
type brokerLog struct {
	mu        sync.Mutex
	announced bool        // a down line without its back line
	settle    *time.Timer // pending back line, since the first success after the latest failure
}

func (l *brokerLog) down(log *slog.Logger, claimed int, firstErr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.settle != nil {
		l.settle.Stop()
		l.settle = nil
	}
	if !l.announced {
		l.announced = true
		log.Warn("txoutbox: the broker took no event of the batch; retrying with backoff (logged once until it takes events again)",
			"events", claimed, "first_error", firstErr)
	}
}

func (l *brokerLog) up(log *slog.Logger) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.announced || l.settle != nil {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(brokerSettle, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.settle == t {
			l.back(log)
		}
	})
	l.settle = t
}

// flush announces the broker back at once if it took events since its
// latest failure: the relay stops, or a Drain ends.
func (l *brokerLog) flush(log *slog.Logger) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.settle != nil {
		l.settle.Stop()
		l.back(log)
	}
}

// back writes the back line; l.mu is held.
func (l *brokerLog) back(log *slog.Logger) {
	l.settle = nil
	if l.announced {
		l.announced = false
		log.Info("txoutbox: the broker takes events again")
	}
}
