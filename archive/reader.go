package archive

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"time"

	"gocloud.dev/blob"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// Filter selects archived events, with the fields and meaning of the
// table's replay (dialect.ReplayFilter): Seq and creation-time ranges,
// aggregate and event type. An empty filter is refused unless All is set.
type Filter = dialect.ReplayFilter

// Reader reads an archive back. Build one with NewReader.
type Reader struct {
	bucket *blob.Bucket
	prefix string
}

// NewReader returns the Reader of the archive under prefix in bucket (the
// Prefix the Archiver was given; "" for the whole bucket).
func NewReader(bucket *blob.Bucket, prefix string) *Reader {
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return &Reader{bucket: bucket, prefix: prefix}
}

// Manifests returns the manifest of every archived object, by first Seq.
func (r *Reader) Manifests(ctx context.Context) ([]Manifest, error) {
	var ms []Manifest
	it := r.bucket.List(&blob.ListOptions{Prefix: r.prefix})
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("archive: list: %w", err)
		}
		if !strings.HasSuffix(obj.Key, manifestSuffix) {
			continue
		}
		m, err := readManifest(ctx, r.bucket, obj.Key)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool {
		if ms[i].FirstSeq != ms[j].FirstSeq {
			return ms[i].FirstSeq < ms[j].FirstSeq
		}
		return ms[i].Object < ms[j].Object
	})
	return ms, nil
}

func checkFilter(f Filter) error {
	empty := f.FromSeq == 0 && f.ToSeq == 0 && f.CreatedFrom.IsZero() && f.CreatedTo.IsZero() &&
		f.AggregateType == "" && f.AggregateID == "" && f.EventType == ""
	if empty && !f.All {
		return fmt.Errorf("%w: empty replay filter; set All to replay every archived event", dialect.ErrInvalidFilter)
	}
	if f.FromSeq < 0 || f.ToSeq < 0 || (f.ToSeq != 0 && f.ToSeq < f.FromSeq) {
		return fmt.Errorf("%w: bad seq range %d..%d", dialect.ErrInvalidFilter, f.FromSeq, f.ToSeq)
	}
	return nil
}

// mayHold reports whether m's object may hold events f selects, from the
// manifest alone.
func mayHold(m Manifest, f Filter) bool {
	switch {
	case f.FromSeq != 0 && m.LastSeq < f.FromSeq,
		f.ToSeq != 0 && m.FirstSeq > f.ToSeq,
		!f.CreatedFrom.IsZero() && m.CreatedTo.Before(f.CreatedFrom),
		!f.CreatedTo.IsZero() && !m.CreatedFrom.Before(f.CreatedTo):
		return false
	}
	return true
}

// wholly reports whether f selects every event of m's object, from the
// manifest alone.
func wholly(m Manifest, f Filter) bool {
	return f.AggregateType == "" && f.AggregateID == "" && f.EventType == "" &&
		(f.FromSeq == 0 || m.FirstSeq >= f.FromSeq) && (f.ToSeq == 0 || m.LastSeq <= f.ToSeq) &&
		(f.CreatedFrom.IsZero() || !m.CreatedFrom.Before(f.CreatedFrom)) &&
		(f.CreatedTo.IsZero() || m.CreatedTo.Before(f.CreatedTo))
}

func matches(ev core.Event, f Filter) bool {
	switch {
	case f.FromSeq != 0 && ev.Seq < f.FromSeq,
		f.ToSeq != 0 && ev.Seq > f.ToSeq,
		!f.CreatedFrom.IsZero() && ev.CreatedAt.Before(f.CreatedFrom),
		!f.CreatedTo.IsZero() && !ev.CreatedAt.Before(f.CreatedTo),
		f.AggregateType != "" && ev.AggregateType != f.AggregateType,
		f.AggregateID != "" && ev.AggregateID != f.AggregateID,
		f.EventType != "" && ev.EventType != f.EventType:
		return false
	}
	return true
}

// Count returns how many archived events f selects, each counted once. It
// reads only the objects whose manifests cannot answer.
func (r *Reader) Count(ctx context.Context, f Filter) (int64, error) {
	if err := checkFilter(f); err != nil {
		return 0, err
	}
	ms, err := r.Manifests(ctx)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, group := range overlapping(ms, f) {
		if len(group) == 1 && wholly(group[0], f) {
			n += int64(group[0].Count)
			continue
		}
		err := r.merge(ctx, group, f, func(core.Event) error { n++; return nil })
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Events calls fn with every archived event f selects, in Seq order, each
// once (objects written twice by interrupted runs are merged), checking
// every object it reads against its manifest. An error of fn stops it and
// is returned.
func (r *Reader) Events(ctx context.Context, f Filter, fn func(core.Event) error) error {
	if err := checkFilter(f); err != nil {
		return err
	}
	ms, err := r.Manifests(ctx)
	if err != nil {
		return err
	}
	for _, group := range overlapping(ms, f) {
		if err := r.merge(ctx, group, f, fn); err != nil {
			return err
		}
	}
	return nil
}

// overlapping returns the manifests f may select, in groups whose Seq
// ranges overlap (most groups have one object), groups by first Seq.
func overlapping(ms []Manifest, f Filter) [][]Manifest {
	var groups [][]Manifest
	var end int64 = -1
	for _, m := range ms {
		if !mayHold(m, f) {
			continue
		}
		if len(groups) > 0 && m.FirstSeq <= end {
			groups[len(groups)-1] = append(groups[len(groups)-1], m)
		} else {
			groups = append(groups, []Manifest{m})
		}
		end = max(end, m.LastSeq)
	}
	return groups
}

// merge streams the events of a group of objects in Seq order, once each.
// Every object of the group is read concurrently, one record ahead.
func (r *Reader) merge(ctx context.Context, group []Manifest, f Filter, fn func(core.Event) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h := &cursorHeap{}
	var cursors []*cursor
	for _, m := range group {
		c := &cursor{ch: make(chan record, 64), done: make(chan error, 1)}
		cursors = append(cursors, c)
		go func() {
			defer close(c.ch)
			c.done <- readObject(ctx, r.bucket, m, func(rec record) error {
				select {
				case c.ch <- rec:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})
		}()
		if c.next() {
			heap.Push(h, c)
		}
	}
	last := int64(-1)
	for h.Len() > 0 {
		c := (*h)[0]
		rec := c.cur
		if c.next() {
			heap.Fix(h, 0)
		} else {
			heap.Pop(h)
		}
		if rec.Seq == last {
			continue
		}
		last = rec.Seq
		if ev := rec.event(); matches(ev, f) {
			if err := fn(ev); err != nil {
				return err
			}
		}
	}
	var errs []error
	for _, c := range cursors {
		errs = append(errs, <-c.done)
	}
	return errors.Join(errs...)
}

type cursor struct {
	ch   chan record
	done chan error
	cur  record
}

func (c *cursor) next() bool {
	rec, ok := <-c.ch
	c.cur = rec
	return ok
}

type cursorHeap []*cursor

func (h cursorHeap) Len() int           { return len(h) }
func (h cursorHeap) Less(i, j int) bool { return h[i].cur.Seq < h[j].cur.Seq }
func (h cursorHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *cursorHeap) Push(x any)        { *h = append(*h, x.(*cursor)) }
func (h *cursorHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// ReplayOptions configures Replay.
type ReplayOptions struct {
	// BatchSize is how many events one Publish call sends. Default 100.
	BatchSize int
	// Attempts is how often an event whose publish failed is tried in
	// all before Replay stops with its error. Default 5; permanent errors
	// (core.IsPermanent) stop at once.
	Attempts int
	// Backoff is the pause before a failed batch is tried again.
	// Default 1s.
	Backoff time.Duration
	// OnProgress, if set, is called after each batch with the events
	// published so far and the total f selects (counted first).
	OnProgress func(done, total int64)
	// Logger receives the retries. Default slog.Default().
	Logger *slog.Logger
}

// Replay publishes the archived events f selects through pub, in Seq
// order, with their original IDs, and returns how many it published. It
// counts them first (Count), for OnProgress. It stops at the first event
// that fails Attempts times, with an error that names its Seq: replay
// from there once the broker is back (Filter.FromSeq).
func Replay(ctx context.Context, r *Reader, pub core.Publisher, f Filter, opts ReplayOptions) (int64, error) {
	if pub == nil {
		return 0, fmt.Errorf("%w: archive.Replay needs a publisher", core.ErrInvalidOptions)
	}
	if opts.BatchSize < 0 || opts.Attempts < 0 || opts.Backoff < 0 {
		return 0, fmt.Errorf("%w: negative replay option", core.ErrInvalidOptions)
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = 100
	}
	if opts.Attempts == 0 {
		opts.Attempts = 5
	}
	if opts.Backoff == 0 {
		opts.Backoff = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	total, err := r.Count(ctx, f)
	if err != nil {
		return 0, err
	}
	var done int64
	batch := make([]core.Event, 0, opts.BatchSize)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := publishAll(ctx, pub, batch, opts); err != nil {
			return err
		}
		done += int64(len(batch))
		batch = batch[:0]
		if opts.OnProgress != nil {
			opts.OnProgress(done, total)
		}
		return nil
	}
	err = r.Events(ctx, f, func(ev core.Event) error {
		batch = append(batch, ev)
		if len(batch) < opts.BatchSize {
			return nil
		}
		return flush()
	})
	if err == nil {
		err = flush()
	}
	return done, err
}

// publishAll publishes batch, trying the events that failed again until
// each was published or failed Attempts times.
func publishAll(ctx context.Context, pub core.Publisher, batch []core.Event, opts ReplayOptions) error {
	todo := batch
	for attempt := 1; ; attempt++ {
		err := pub.Publish(ctx, todo)
		if err == nil {
			return nil
		}
		var be *core.BatchError
		failed := todo
		if errors.As(err, &be) && len(be.Errs) == len(todo) {
			failed = nil
			for i, e := range be.Errs {
				if e != nil {
					failed = append(failed, todo[i])
					if core.IsPermanent(e) {
						return fmt.Errorf("archive: replay: event %s (seq %d) cannot be published: %w", todo[i].ID, todo[i].Seq, e)
					}
				}
			}
		} else if core.IsPermanent(err) {
			return fmt.Errorf("archive: replay from seq %d: %w", todo[0].Seq, err)
		}
		if attempt >= opts.Attempts || ctx.Err() != nil {
			return fmt.Errorf("archive: replay: %d events from seq %d failed %d times: %w", len(failed), failed[0].Seq, attempt, err)
		}
		opts.Logger.Warn("txoutbox: archive replay: publish failed; trying again", "events", len(failed), "attempt", attempt, "error", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(opts.Backoff):
		}
		todo = failed
	}
}
