package kafkabroker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/txoutbox/core"
)

// ErrTransactions is wrapped by the error of a transactional publisher
// that the cluster does not let take its transactional ID or read its
// position: transactions disabled or unauthorized, too few brokers for the
// transaction state log, the position topic not creatable.
var ErrTransactions = errors.New("kafkabroker: transactions unavailable")

// DefaultPositionTopic is Transactional.PositionTopic's default.
const DefaultPositionTopic = "txoutbox-positions"

// DefaultTransactionTimeout is Transactional.Timeout's default.
const DefaultTransactionTimeout = time.Minute

// Transactional configures transactional publishing (Options.Transactional).
type Transactional struct {
	// ID is the transactional ID: one per log-mode relay's log, such as
	// the slot's name (PostgreSQL) or the stream's (MySQL, MariaDB).
	// Relays that stream one log take it over from each other under the
	// same ID: each one's start fences the one before, whose open
	// transaction the cluster aborts and whose later commits it refuses.
	// Required.
	ID string
	// PositionTopic is the compacted topic in which a log-mode relay
	// stores its position, keyed by ID, in the transaction of each batch.
	// NewPublisher creates it (one partition, cleanup.policy=compact) if
	// it is missing. Default DefaultPositionTopic.
	PositionTopic string
	// Timeout is the transaction timeout: how long the cluster lets a
	// transaction stay open before it aborts it. It bounds how long a
	// killed relay's open transaction holds back read_committed consumers
	// when no relay takes its ID over. At most the cluster's
	// transaction.max.timeout.ms (15 minutes unless set). Default
	// DefaultTransactionTimeout.
	Timeout time.Duration
}

func (t *Transactional) check() error {
	if t.ID == "" {
		return fmt.Errorf("%w: kafkabroker: Transactional.ID is empty", core.ErrInvalidOptions)
	}
	if t.Timeout < 0 {
		return fmt.Errorf("%w: kafkabroker: Transactional.Timeout %s is negative", core.ErrInvalidOptions, t.Timeout)
	}
	if t.Timeout == 0 {
		t.Timeout = DefaultTransactionTimeout
	}
	if t.PositionTopic == "" {
		t.PositionTopic = DefaultPositionTopic
	}
	if err := validTopic(t.PositionTopic); err != nil {
		return fmt.Errorf("%w: kafkabroker: Transactional.PositionTopic: %w", core.ErrInvalidOptions, err)
	}
	return nil
}

// startTransactional asks for the transactional ID's coordinator and makes
// sure the position topic exists, so that NewPublisher reports a cluster
// that refuses either. It does not take the ID: that would fence the relay
// streaming now, when this one is only starting to stand by.
func (p *Publisher) startTransactional(cl *kgo.Client) error {
	t := p.opts.Transactional
	if t == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	adm := kadm.NewClient(cl)
	if err := adm.FindTxnCoordinators(ctx, t.ID).Error(); err != nil {
		return fmt.Errorf("%w: find the transaction coordinator of %q: %w", ErrTransactions, t.ID, err)
	}
	resp, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": ptr("compact")}, t.PositionTopic)
	if err == nil && !errors.Is(resp.Err, kerr.TopicAlreadyExists) {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("%w: create position topic %q: %w", ErrTransactions, t.PositionTopic, err)
	}
	return nil
}

var _ core.PositionPublisher = (*Publisher)(nil)

func ptr[T any](v T) *T { return &v }

// position is the value of a position record.
type position struct {
	Position uint64 `json:"position"`
}

// CommittedPosition starts a new producer session under the transactional
// ID, which fences any other producer of it (the cluster aborts its open
// transaction), and returns the position last stored under that ID (by a
// Publish whose context carried one, core.WithPosition), 0 if none. A log-mode relay calls it when it starts
// streaming, and skips what the log sends again up to that position.
func (p *Publisher) CommittedPosition(ctx context.Context) (uint64, error) {
	t := p.opts.Transactional
	if t == nil {
		return 0, fmt.Errorf("%w: kafkabroker: CommittedPosition needs Options.Transactional", core.ErrInvalidOptions)
	}
	p.rw.RLock()
	defer p.rw.RUnlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, fmt.Errorf("%w: kafkabroker: publisher closed", core.ErrClosed)
	}
	// A new client is a new producer session: its ProducerID call is the
	// InitProducerID that bumps the epoch, whatever state the old one was
	// in.
	p.drop()
	cl, err := p.connect(true)
	if err != nil {
		return 0, err
	}
	if _, _, err := cl.ProducerID(ctx); err != nil {
		cl.Close()
		return 0, fmt.Errorf("%w: take transactional ID %q: %w", ErrTransactions, t.ID, err)
	}
	p.tx = cl
	pos, err := p.readPosition(ctx)
	if err != nil {
		return 0, fmt.Errorf("kafkabroker: read the position of %q from %q: %w", t.ID, t.PositionTopic, err)
	}
	return pos, nil
}

// readPosition reads the position topic's last committed record keyed by
// the transactional ID. The topic's only partition holds every relay's
// records, so it reads back from the end in growing windows until it finds
// one of its own or reaches the start.
func (p *Publisher) readPosition(ctx context.Context) (uint64, error) {
	t := p.opts.Transactional
	adm := kadm.NewClient(p.cl)
	ends, err := adm.ListEndOffsets(ctx, t.PositionTopic)
	if err != nil {
		return 0, err
	}
	end, ok := ends.Lookup(t.PositionTopic, 0)
	if !ok || end.Err != nil {
		return 0, fmt.Errorf("no end offset for partition 0: %w", cmp.Or(end.Err, error(kerr.UnknownTopicOrPartition)))
	}
	starts, err := adm.ListStartOffsets(ctx, t.PositionTopic)
	if err != nil {
		return 0, err
	}
	first, _ := starts.Lookup(t.PositionTopic, 0)
	if end.Offset <= first.Offset {
		return 0, nil
	}
	// Transactions of other relays open below end would hide what
	// follows them from a read_committed read: wait for them to end
	// (commit, abort or time out).
	for {
		lso, err := adm.ListCommittedOffsets(ctx, t.PositionTopic)
		if err != nil {
			return 0, err
		}
		if o, ok := lso.Lookup(t.PositionTopic, 0); ok && o.Err == nil && o.Offset >= end.Offset {
			break
		}
		select {
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Each window reads only what the one before did not: a record of the
	// ID found there would have ended the read.
	to := end.Offset
	for window := int64(256); ; window *= 8 {
		from := max(first.Offset, end.Offset-window)
		pos, found, err := p.scanPositions(ctx, from, to)
		if err != nil || found || from == first.Offset {
			return pos, err
		}
		to = from
	}
}

// scanPositions reads the position topic's committed records in [from,
// to) and returns the last one keyed by the transactional ID.
func (p *Publisher) scanPositions(ctx context.Context, from, to int64) (uint64, bool, error) {
	t := p.opts.Transactional
	opts := append(p.base[:len(p.base):len(p.base)],
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{t.PositionTopic: {0: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Control records (commit and abort markers) take offsets too,
		// often the last one below to: seeing them tells the read it is
		// through.
		kgo.KeepControlRecords(),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, false, err
	}
	defer cl.Close()
	var pos uint64
	var found bool
	next := from
	for next < to {
		// Records of aborted transactions are not returned: if the last
		// offsets below to are such records, no fetch ever reaches to,
		// and a pause with nothing new means everything was read.
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		fetches := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return 0, false, context.Cause(ctx)
		}
		n := 0
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				ferr = err
			}
		})
		if ferr != nil {
			return 0, false, ferr
		}
		fetches.EachRecord(func(r *kgo.Record) {
			n++
			next = r.Offset + 1
			if r.Offset >= to || r.Attrs.IsControl() || string(r.Key) != t.ID {
				return
			}
			var v position
			if json.Unmarshal(r.Value, &v) == nil {
				pos, found = v.Position, true
			}
		})
		if n == 0 {
			break
		}
	}
	return pos, found, nil
}

// errHeldBack is the error of an event that was not sent because another
// of its transaction could not be.
var errHeldBack = errors.New("not sent: another event of its transaction cannot be sent")

// publishTx publishes events and a record of pos in one transaction.
//
// Events that cannot be records (a bad topic, too large) fail for good
// before any transaction begins; the others then fail with a transient
// error naming them, and the caller sends them again without those. Any
// other failure aborts the transaction (or leaves its outcome to the
// cluster, if the commit itself failed) and fails every event; the
// publisher then starts a new producer session on its next call.
func (p *Publisher) publishTx(ctx context.Context, events []core.Event, pos uint64) error {
	t := p.opts.Transactional
	p.rw.RLock()
	defer p.rw.RUnlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("%w: kafkabroker: publisher closed", core.ErrClosed)
	}
	be := core.NewBatchError(len(events))
	// failAll fails every event that has no error yet with err.
	failAll := func(err error) error {
		for i := range events {
			if be.Errs[i] == nil {
				be.Errs[i] = fmt.Errorf("%w: %s event %s: %w", ErrPublish, events[i].EventType, events[i].ID, err)
			}
		}
		return be
	}
	recs := make([]*kgo.Record, len(events))
	bad := false
	for i := range events {
		rec, err := p.record(ctx, &events[i])
		if err != nil {
			be.Errs[i], bad = err, true
		}
		recs[i] = rec
	}
	if bad {
		return failAll(errHeldBack)
	}
	v, _ := json.Marshal(position{Position: pos})
	recs = append(recs, &kgo.Record{Topic: t.PositionTopic, Key: []byte(t.ID), Value: v})
	if p.tx == nil {
		cl, err := p.connect(true)
		if err != nil {
			return failAll(err)
		}
		p.tx = cl
	}
	if err := p.tx.BeginTransaction(); err != nil {
		p.drop()
		return failAll(fmt.Errorf("begin transaction: %w", err))
	}
	errs := make([]error, len(recs))
	done := make(chan struct{}, len(recs))
	for i, rec := range recs {
		p.tx.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			errs[i] = err
			done <- struct{}{}
		})
	}
	// The client bounds its own retries; the caller's context bounds the
	// wait for them.
	for range recs {
		select {
		case <-done:
		case <-ctx.Done():
			p.drop()
			return failAll(fmt.Errorf("no acknowledgement before the context ended: %w", ctx.Err()))
		}
	}
	var first error
	for i, err := range errs {
		if err == nil {
			continue
		}
		if i < len(events) {
			be.Errs[i] = p.failed(&events[i], err)
		}
		if first == nil {
			first = err
		}
	}
	if first != nil {
		p.abort(ctx)
		return failAll(fmt.Errorf("the transaction was aborted: %w", first))
	}
	if err := p.tx.EndTransaction(ctx, kgo.TryCommit); err != nil {
		// Committed or not, the cluster knows; a new session (and, in log
		// mode, the position it reads) settles it.
		p.drop()
		return failAll(fmt.Errorf("commit: %w", err))
	}
	return nil
}

// abort ends the open transaction without committing it; if that fails,
// the client is dropped, and the next session's fencing aborts it.
func (p *Publisher) abort(ctx context.Context) {
	if p.tx == nil {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.Transactional.Timeout)
	defer cancel()
	if err := p.tx.AbortBufferedRecords(actx); err != nil {
		p.drop()
		return
	}
	if err := p.tx.EndTransaction(actx, kgo.TryAbort); err != nil {
		p.drop()
	}
}

// drop closes the transactional client of a producer session that
// failed; the next call starts another.
func (p *Publisher) drop() {
	if p.tx != nil {
		p.tx.Close()
		p.tx = nil
	}
}
