package core

import (
	"context"
	"fmt"
	"slices"
)

// DefaultPartitionCount is the number of partitions of ordered mode when
// OrderedOptions.PartitionCount is zero and no PartitionLeaser says
// otherwise. It bounds how many relays can share the work: more relays than
// partitions leave some idle.
const DefaultPartitionCount = 32

// OrderingMode selects whether a relay keeps per-aggregate order.
type OrderingMode int

const (
	// OrderingAuto, the default, is ordered mode when the publisher
	// reports that its broker keeps per-key order
	// (PublisherCapabilities.PreservesAggregateOrder: Kafka, SNS FIFO), and
	// unordered mode otherwise. With such a publisher, a store that cannot
	// claim in order fails NewRelay with ErrOrderedUnsupported: the relay
	// never quietly gives up the order the broker would keep.
	OrderingAuto OrderingMode = iota
	// OrderingOff is the unordered mode: claims take any due events, so
	// with several relays or retries an aggregate's events can overtake
	// each other. It has the highest throughput.
	OrderingOff
	// OrderingOn requires ordered mode; NewRelay fails with
	// ErrOrderedUnsupported when the store cannot claim in order.
	OrderingOn
)

// String returns "auto", "off" or "on".
func (m OrderingMode) String() string {
	switch m {
	case OrderingAuto:
		return "auto"
	case OrderingOff:
		return "off"
	case OrderingOn:
		return "on"
	}
	return fmt.Sprintf("OrderingMode(%d)", int(m))
}

// DeadLetterPolicy says what ordered mode does with the later events of an
// aggregate after one of its events was dead-lettered.
type DeadLetterPolicy int

const (
	// DeadLetterBlock, the default, holds the aggregate's later events
	// back until the dead event is re-queued (and published) or purged, so
	// that consumers never see an aggregate with a gap. Other aggregates
	// are not affected.
	DeadLetterBlock DeadLetterPolicy = iota
	// DeadLetterSkip publishes the later events without the dead one. The
	// dead event stays in the outbox, with its last error, for an operator
	// to inspect and re-queue; re-queued, it is published after events that
	// followed it.
	DeadLetterSkip
)

// String returns "block" or "skip".
func (p DeadLetterPolicy) String() string {
	switch p {
	case DeadLetterBlock:
		return "block"
	case DeadLetterSkip:
		return "skip"
	}
	return fmt.Sprintf("DeadLetterPolicy(%d)", int(p))
}

// OrderedClaim turns a claim into an ordered one (ClaimRequest.Ordered).
//
// An ordered claim returns, from the given partitions only, due events that
// have no earlier unpublished event of the same aggregate that is not
// claimable now: an event in backoff holds back the later events of its own
// aggregate and of no other. Dead events hold them back too under
// DeadLetterBlock. Events without an AggregateID are not ordered.
//
// The store must also make sure that no two open claims serve one
// partition, whichever relays hold them (on PostgreSQL a transaction-level
// advisory lock per partition, held until Commit or Release): that, not the
// lease, is what keeps two relays from publishing one aggregate's events at
// once while a lease changes hands. Partitions another claim holds are
// skipped.
type OrderedClaim struct {
	// Partitions to claim from, each in [0, PartitionCount). Nil means
	// all of them.
	Partitions []int
	// PartitionCount is the number of partitions an aggregate ID is hashed
	// into. It is always > 0 and the same for every relay of an outbox.
	PartitionCount int
	// DeadLetter says whether dead events hold their aggregate back.
	DeadLetter DeadLetterPolicy
}

// PartitionLeaser shares the partitions of ordered mode among the relays of
// one outbox: each partition is leased to at most one relay at a time, the
// lease expires unless renewed, and leases are rebalanced when relays join
// or leave. A relay with a leaser claims only from the partitions it holds.
type PartitionLeaser interface {
	// Owner is the identity the leases are held under, unique per relay
	// process.
	Owner() string
	// PartitionCount is the number of partitions leased out.
	PartitionCount() int
	// Held returns the partitions held now, sorted. It never blocks.
	Held() []int
	// Run acquires, renews and rebalances leases until ctx ends, then
	// releases them. It returns nil after ctx ends and an error only when
	// it cannot work at all (for example ErrPartitionCountMismatch).
	Run(ctx context.Context) error
}

// OrderedOptions configures ordered mode.
type OrderedOptions struct {
	// Leaser shares partitions with other relays; Relay.Run runs it (do
	// not run it yourself). Default: the store's
	// (LeaserSource), built with PartitionCount. Without
	// one, the relay claims from every partition; several relays without
	// leasers are still ordered (partitions are never served by two open
	// claims) but contend for every partition. Outside Run (ProcessBatch,
	// Drain) the relay claims from every partition, since its leaser is
	// not running.
	Leaser PartitionLeaser
	// NoLeaser turns the store's leaser off: the relay claims from every
	// partition.
	NoLeaser bool
	// PartitionCount is the number of partitions. Default
	// DefaultPartitionCount; with a Leaser it must be zero or equal the
	// leaser's. Every relay of one outbox must use the same count.
	PartitionCount int
	// DeadLetter is the policy for aggregates with a dead event. Default
	// DeadLetterBlock.
	DeadLetter DeadLetterPolicy
}

func (o OrderedOptions) withDefaults() (OrderedOptions, error) {
	if o.PartitionCount < 0 {
		return o, fmt.Errorf("%w: negative PartitionCount", ErrInvalidOptions)
	}
	if o.DeadLetter != DeadLetterBlock && o.DeadLetter != DeadLetterSkip {
		return o, fmt.Errorf("%w: unknown DeadLetterPolicy %d", ErrInvalidOptions, int(o.DeadLetter))
	}
	if o.Leaser != nil {
		n := o.Leaser.PartitionCount()
		if o.PartitionCount != 0 && o.PartitionCount != n {
			return o, fmt.Errorf("%w: PartitionCount %d but the leaser has %d: %w", ErrInvalidOptions, o.PartitionCount, n, ErrPartitionCountMismatch)
		}
		o.PartitionCount = n
	}
	if o.PartitionCount == 0 {
		o.PartitionCount = DefaultPartitionCount
	}
	return o, nil
}

// resolveOrdering decides at NewRelay whether the relay runs ordered, and
// sets up its ordered options (the store's leaser among them).
func resolveOrdering(o *RelayOptions, store Store, caps StoreCapabilities, pcaps PublisherCapabilities) (bool, error) {
	switch o.Ordering {
	case OrderingOff:
		return false, nil
	case OrderingAuto:
		if !pcaps.PreservesAggregateOrder {
			return false, nil
		}
	case OrderingOn:
	default:
		return false, fmt.Errorf("%w: unknown OrderingMode %d", ErrInvalidOptions, int(o.Ordering))
	}
	if !caps.OrderedClaims {
		why := "RelayOptions.Ordering is OrderingOn"
		if o.Ordering == OrderingAuto {
			why = "the publisher's broker keeps aggregate order (set RelayOptions.Ordering to OrderingOff to relay unordered on purpose)"
		}
		return false, fmt.Errorf("%w: %s", ErrOrderedUnsupported, why)
	}
	if o.Ordered.Leaser != nil && o.Ordered.NoLeaser {
		return false, fmt.Errorf("%w: OrderedOptions has both a Leaser and NoLeaser", ErrInvalidOptions)
	}
	if o.Ordered.Leaser != nil && !caps.OrderedPartitions {
		return false, fmt.Errorf("%w: OrderedOptions.Leaser on a store that serves ordered claims of every partition only (StoreCapabilities.OrderedPartitions)", ErrInvalidOptions)
	}
	oo, err := o.Ordered.withDefaults()
	if err != nil {
		return false, err
	}
	if src, ok := StoreAs[LeaserSource](store); ok && oo.Leaser == nil && !oo.NoLeaser && caps.OrderedPartitions {
		l, err := src.NewLeaser(LeaserConfig{PartitionCount: oo.PartitionCount, Logger: o.Logger})
		if err != nil {
			return false, fmt.Errorf("txoutbox: the store's partition leaser: %w", err)
		}
		if l.PartitionCount() != oo.PartitionCount {
			return false, fmt.Errorf("%w: the store's leaser has %d partitions, want %d: %w", ErrInvalidOptions, l.PartitionCount(), oo.PartitionCount, ErrPartitionCountMismatch)
		}
		oo.Leaser = l
	}
	o.Ordered = oo
	return true, nil
}

// orderedRequest returns the ordered claim for one worker (worker < 0: all
// partitions the relay may serve), or false when the worker has none.
func (r *Relay) orderedRequest(worker int) (*OrderedClaim, bool) {
	o := r.opts.Ordered
	if !r.caps.OrderedPartitions {
		return &OrderedClaim{PartitionCount: o.PartitionCount, DeadLetter: o.DeadLetter}, true
	}
	var parts []int
	if o.Leaser != nil && r.running.Load() {
		parts = o.Leaser.Held()
	} else {
		parts = make([]int, o.PartitionCount)
		for i := range parts {
			parts[i] = i
		}
	}
	if conc := r.opts.Concurrency; worker >= 0 && conc > 1 {
		// Split the partitions among the workers so that they do not
		// contend for the same ones; an overlap while the set changes is
		// harmless, since the store never serves a partition to two
		// claims at once.
		mine := make([]int, 0, len(parts)/conc+1)
		for j, p := range parts {
			if j%conc == worker {
				mine = append(mine, p)
			}
		}
		parts = mine
	}
	if len(parts) == 0 {
		return nil, false
	}
	return &OrderedClaim{Partitions: parts, PartitionCount: o.PartitionCount, DeadLetter: o.DeadLetter}, true
}

// publishOrdered publishes a claimed batch so that no event goes out before
// an earlier event of its aggregate in the batch was accepted: in rounds,
// round k holding the k-th event of every aggregate still going. An
// aggregate whose event fails drops out; its later events are left out of
// the outcome, so the store releases them unchanged. cut reports that the
// batch was cut off by shutdown (outcomes unknown).
func (r *Relay) publishOrdered(ctx context.Context, events []Event) (out Outcome, res RelayCounters, rep batchReport, cut bool) {
	// Per aggregate, in Seq order: the claim's order may differ (a
	// retried event has a later next_attempt_at).
	var groups [][]Event
	byAgg := map[string]int{}
	sorted := slices.Clone(events)
	slices.SortStableFunc(sorted, func(a, b Event) int { return compareSeq(a.Seq, b.Seq) })
	for _, ev := range sorted {
		if ev.AggregateID == "" {
			groups = append(groups, []Event{ev}) // unordered: its own group
			continue
		}
		g, ok := byAgg[ev.AggregateID]
		if !ok {
			g = len(groups)
			byAgg[ev.AggregateID] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], ev)
	}
	res.Claimed = int64(len(events))
	// One timeout for all rounds: it bounds how long the batch holds its
	// partitions. Only ctx (shutdown) cuts the batch off; a timeout fails
	// the events not yet sent, so that they wait out their backoff instead
	// of being claimed again at once.
	pctx, done := r.publishContext(ctx, len(events))
	defer done()
	stopped := make([]bool, len(groups))
	for round := 0; ; round++ {
		var batch []Event
		var from []int // group of each event of the round
		for g, evs := range groups {
			if !stopped[g] && round < len(evs) {
				batch = append(batch, evs[round])
				from = append(from, g)
			}
		}
		if len(batch) == 0 {
			break
		}
		err := r.publish(pctx, batch)
		if ctx.Err() != nil {
			return Outcome{}, RelayCounters{}, batchReport{}, true
		}
		o, rr, rp := r.outcome(batch, err, publishTimedOut(pctx))
		rep.merge(rp)
		out.Published = append(out.Published, o.Published...)
		out.Failed = append(out.Failed, o.Failed...)
		res.Published += rr.Published
		res.Failed += rr.Failed
		res.DeadLettered += rr.DeadLettered
		if len(o.Failed) == 0 {
			continue
		}
		failed := make(map[int64]Failure, len(o.Failed))
		for _, f := range o.Failed {
			failed[f.Seq] = f
		}
		for i, ev := range batch {
			f, ok := failed[ev.Seq]
			if !ok {
				continue
			}
			g := from[i]
			stopped[g] = true
			if held := len(groups[g]) - round - 1; held > 0 {
				r.log.Debug("txoutbox: ordered: later events of the aggregate wait for this one",
					"aggregate_id", ev.AggregateID, "seq", ev.Seq, "held_back_in_batch", held)
			}
			if f.Dead && ev.AggregateID != "" {
				if r.opts.Ordered.DeadLetter == DeadLetterBlock {
					r.log.Error("txoutbox: ordered: aggregate blocked by a dead event until it is re-queued or purged",
						"aggregate_id", ev.AggregateID, "seq", ev.Seq, "event_id", ev.ID)
				} else {
					r.log.Error("txoutbox: ordered: dead event skipped; later events of its aggregate are published without it",
						"aggregate_id", ev.AggregateID, "seq", ev.Seq, "event_id", ev.ID)
				}
			}
		}
	}
	return out, res, rep, false
}

func compareSeq(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
