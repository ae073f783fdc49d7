package archive

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/txoutbox/txoutbox/core"
)

// Format names the layout of the objects and manifests this package writes.
const Format = "txoutbox-archive/1"

// DefaultLockName is Options.LockName's default.
const DefaultLockName = "txoutbox_archive"

// MaxBatchSize bounds Options.BatchSize: a batch is held in memory, written
// as one object and deleted in one statement.
const MaxBatchSize = 100_000

// ErrLocked means another archiver holds the lock (Options.LockName), so
// this one did nothing.
var ErrLocked = errors.New("archive: another archiver holds the lock")

// ErrCorrupt means an archived object does not match its manifest: a
// checksum, a count or a record differs.
var ErrCorrupt = errors.New("archive: object does not match its manifest")

// Source is the part of an outbox store an Archiver reads and deletes.
// sqlxoutbox.Outbox (and so the GORM store) and pgxoutbox.Outbox implement
// it.
type Source interface {
	// ListPublished returns at most limit events published before the
	// given time, in Seq order.
	ListPublished(ctx context.Context, before time.Time, limit int) ([]core.Event, error)
	// DeleteArchived deletes the events at seqs that are still published
	// before the given time, in one transaction.
	DeleteArchived(ctx context.Context, seqs []int64, before time.Time) (int64, error)
	// TryLock takes a named lock of the database without waiting.
	TryLock(ctx context.Context, name string) (release func(), ok bool, err error)
}

// Options configures an Archiver.
type Options struct {
	// Retention is how long published events stay in the table before
	// they are archived and deleted (Archive). Default 30 days, as cleanup.
	Retention time.Duration
	// BatchSize is the most events one step lists, writes and deletes.
	// Default 10000; at most MaxBatchSize.
	BatchSize int
	// Prefix is prepended to every object name, e.g. "orders/". Objects
	// are named <Prefix>YYYY/MM/DD/<first seq>-<last seq>-<digest>.jsonl.gz.
	Prefix string
	// LockName is the database lock that lets one archiver of the table
	// run at a time. Give each archived table its own. Default
	// DefaultLockName.
	LockName string
	// Logger receives what was archived. Default slog.Default().
	Logger *slog.Logger
}

// Result counts what an archive run did.
type Result struct {
	// Events is how many events were written to the archive, or found
	// there already from an interrupted run.
	Events int64
	// Objects is how many objects were written.
	Objects int
	// Reused is how many objects an interrupted run had already written
	// and verified, and were kept as they were.
	Reused int
	// Deleted is how many rows were deleted after their object was
	// verified.
	Deleted int64
}

// Archiver writes published events to a bucket and deletes them from the
// table. Build one with New; it is safe for concurrent use, and one
// archives at a time per LockName.
type Archiver struct {
	src    Source
	bucket *blob.Bucket
	opts   Options
	// crash, set by tests only, is called at each point where a process
	// may die; an error stops the step there, as a kill would.
	crash func(point string) error
}

// New returns the Archiver of src into bucket. The caller keeps ownership
// of the bucket (and closes it).
func New(src Source, bucket *blob.Bucket, opts Options) (*Archiver, error) {
	if src == nil || bucket == nil {
		return nil, fmt.Errorf("%w: archive.New needs a source and a bucket", core.ErrInvalidOptions)
	}
	switch {
	case opts.Retention < 0:
		return nil, fmt.Errorf("%w: negative archive Retention", core.ErrInvalidOptions)
	case opts.Retention == 0:
		opts.Retention = 30 * 24 * time.Hour
	}
	switch {
	case opts.BatchSize < 0 || opts.BatchSize > MaxBatchSize:
		return nil, fmt.Errorf("%w: archive BatchSize %d is outside 1..%d", core.ErrInvalidOptions, opts.BatchSize, MaxBatchSize)
	case opts.BatchSize == 0:
		opts.BatchSize = 10_000
	}
	if opts.LockName == "" {
		opts.LockName = DefaultLockName
	}
	if opts.Prefix != "" && !strings.HasSuffix(opts.Prefix, "/") {
		opts.Prefix += "/"
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Archiver{src: src, bucket: bucket, opts: opts}, nil
}

// Archive archives, in batches, every event published more than Retention
// ago, and deletes its row once its object is verified. onProgress, if not
// nil, is called after each batch with the running totals. It returns
// ErrLocked when another archiver holds the lock.
func (a *Archiver) Archive(ctx context.Context, onProgress func(Result)) (Result, error) {
	return a.ArchiveBefore(ctx, time.Now().Add(-a.opts.Retention), onProgress)
}

// ArchiveBefore is Archive with an explicit cut-off: events published
// before the given time.
func (a *Archiver) ArchiveBefore(ctx context.Context, before time.Time, onProgress func(Result)) (Result, error) {
	var total Result
	for {
		r, err := a.step(ctx, before, a.opts.BatchSize)
		total.add(r)
		if err != nil {
			return total, err
		}
		if onProgress != nil && r.Events > 0 {
			onProgress(total)
		}
		if r.Events < int64(a.opts.BatchSize) {
			return total, nil
		}
	}
}

// DeletePublished implements core.Cleaner, so that core.RunCleanup (and
// core.Cleanup) archive before they delete: it archives at most limit
// events published before the given time and returns how many rows it
// deleted. When another archiver holds the lock it does nothing and
// returns 0, which ends the cleanup pass; that archiver does the work.
func (a *Archiver) DeletePublished(ctx context.Context, before time.Time, limit int) (int64, error) {
	if limit <= 0 || limit > MaxBatchSize {
		return 0, fmt.Errorf("%w: archive batch %d is outside 1..%d", core.ErrInvalidOptions, limit, MaxBatchSize)
	}
	r, err := a.step(ctx, before, limit)
	if errors.Is(err, ErrLocked) {
		a.opts.Logger.Debug("txoutbox: archive skipped: another archiver holds the lock", "lock", a.opts.LockName)
		return 0, nil
	}
	return r.Deleted, err
}

// Then returns a core.Cleaner that archives with a and, once a pass has
// archived everything due, runs next: with a dialect.PartitionMaintainer
// as next, a day-partitioned outbox is archived and its emptied partitions
// are dropped. A partition is dropped only when it holds no pending, dead
// or recently published event, so never before its events are archived.
func (a *Archiver) Then(next core.Cleaner) core.Cleaner { return &then{a: a, next: next} }

type then struct {
	a    *Archiver
	next core.Cleaner
}

func (t *then) DeletePublished(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := t.a.DeletePublished(ctx, before, limit)
	if err != nil || n >= int64(limit) {
		return n, err
	}
	m, err := t.next.DeletePublished(ctx, before, limit)
	return n + m, err
}

func (r *Result) add(o Result) {
	r.Events += o.Events
	r.Objects += o.Objects
	r.Reused += o.Reused
	r.Deleted += o.Deleted
}

// step archives one batch under the lock: list, write and verify each
// day's object, then delete the batch's rows.
func (a *Archiver) step(ctx context.Context, before time.Time, limit int) (Result, error) {
	var res Result
	release, ok, err := a.src.TryLock(ctx, a.opts.LockName)
	if err != nil {
		return res, fmt.Errorf("archive: %w", err)
	}
	if !ok {
		return res, ErrLocked
	}
	defer release()
	evs, err := a.src.ListPublished(ctx, before, limit)
	if err != nil || len(evs) == 0 {
		return res, err
	}
	seqs := make([]int64, 0, len(evs))
	for _, day := range byDay(evs) {
		reused, err := a.put(ctx, day)
		if err != nil {
			return res, err
		}
		if reused {
			res.Reused++
		} else {
			res.Objects++
		}
		res.Events += int64(len(day))
		for _, ev := range day {
			seqs = append(seqs, ev.Seq)
		}
	}
	if err := a.hook("before-delete"); err != nil {
		return res, err
	}
	n, err := a.src.DeleteArchived(ctx, seqs, before)
	res.Deleted = n
	if err != nil {
		return res, fmt.Errorf("archive: delete %d archived events: %w", len(seqs), err)
	}
	if n < int64(len(seqs)) {
		// Replayed since they were listed: pending again, so kept; their
		// next archive holds them once more, under another name.
		a.opts.Logger.Info("txoutbox: archived events made pending meanwhile were kept",
			"kept", int64(len(seqs))-n)
	}
	if err := a.hook("after-delete"); err != nil {
		return res, err
	}
	a.opts.Logger.Debug("txoutbox: archived", "events", res.Events, "objects", res.Objects, "reused", res.Reused, "deleted", n)
	return res, nil
}

func (a *Archiver) hook(point string) error {
	if a.crash == nil {
		return nil
	}
	return a.crash(point)
}

// byDay splits events in Seq order into runs of one day of creation (UTC),
// each in Seq order, ordered by their first event.
func byDay(evs []core.Event) [][]core.Event {
	idx := map[string]int{}
	var out [][]core.Event
	for _, ev := range evs {
		d := ev.CreatedAt.UTC().Format("2006/01/02")
		i, ok := idx[d]
		if !ok {
			i = len(out)
			idx[d] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], ev)
	}
	return out
}

// put writes the object and manifest of one day's events and verifies
// them, or finds them already written and verified by an interrupted run
// (reused).
func (a *Archiver) put(ctx context.Context, evs []core.Event) (reused bool, err error) {
	digest := eventsDigest(evs)
	first, last := evs[0], evs[len(evs)-1]
	name := a.opts.Prefix + first.CreatedAt.UTC().Format("2006/01/02/") +
		fmt.Sprintf("%020d-%020d-%s", first.Seq, last.Seq, digest[:16]) + ".jsonl.gz"
	if m, err := readManifest(ctx, a.bucket, name+manifestSuffix); err == nil && m.EventsDigest == digest {
		if err := verify(ctx, a.bucket, m); err == nil {
			return true, nil
		}
	}
	body, sum, err := encode(evs)
	if err != nil {
		return false, err
	}
	if err := a.bucket.WriteAll(ctx, name, body, &blob.WriterOptions{ContentType: "application/gzip"}); err != nil {
		return false, fmt.Errorf("archive: write %s: %w", name, err)
	}
	if err := a.hook("after-object"); err != nil {
		return false, err
	}
	m := manifestOf(evs, name, sum, digest, len(body))
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return false, fmt.Errorf("archive: manifest of %s: %w", name, err)
	}
	if err := a.bucket.WriteAll(ctx, name+manifestSuffix, mb, &blob.WriterOptions{ContentType: "application/json"}); err != nil {
		return false, fmt.Errorf("archive: write manifest of %s: %w", name, err)
	}
	if err := a.hook("after-manifest"); err != nil {
		return false, err
	}
	// Read back what the bucket holds now, not what was sent.
	back, err := readManifest(ctx, a.bucket, name+manifestSuffix)
	if err != nil {
		return false, err
	}
	if back.EventsDigest != digest || back.Count != len(evs) {
		return false, fmt.Errorf("%w: %s: manifest read back differs from the one written", ErrCorrupt, name)
	}
	if err := verify(ctx, a.bucket, back); err != nil {
		return false, err
	}
	return false, nil
}

// manifestSuffix follows an object's name to make its manifest's.
const manifestSuffix = ".manifest.json"

// Manifest describes one archived object.
type Manifest struct {
	// Format is Format.
	Format string `json:"format"`
	// Object is the name of the object in the bucket.
	Object string `json:"object"`
	// Count is how many events the object holds.
	Count int `json:"count"`
	// FirstSeq and LastSeq are the first and last Seq of its events.
	FirstSeq int64 `json:"first_seq"`
	LastSeq  int64 `json:"last_seq"`
	// CreatedFrom and CreatedTo are the earliest and latest CreatedAt.
	CreatedFrom time.Time `json:"created_from"`
	CreatedTo   time.Time `json:"created_to"`
	// PublishedFrom and PublishedTo are the earliest and latest PublishedAt.
	PublishedFrom time.Time `json:"published_from"`
	PublishedTo   time.Time `json:"published_to"`
	// Bytes and SHA256 are the size and the SHA-256 (hex) of the object as
	// stored (compressed).
	Bytes  int    `json:"bytes"`
	SHA256 string `json:"sha256"`
	// EventsDigest is the SHA-256 (hex) of the Seq and ID of every event,
	// in order: what names the object, and what tells whether two objects
	// hold the same events.
	EventsDigest string `json:"events_digest"`
}

func manifestOf(evs []core.Event, name, sum, digest string, size int) Manifest {
	m := Manifest{
		Format: Format, Object: name, Count: len(evs),
		FirstSeq: evs[0].Seq, LastSeq: evs[len(evs)-1].Seq,
		Bytes: size, SHA256: sum, EventsDigest: digest,
	}
	for i, ev := range evs {
		c := ev.CreatedAt.UTC()
		var p time.Time
		if ev.PublishedAt != nil {
			p = ev.PublishedAt.UTC()
		}
		if i == 0 || c.Before(m.CreatedFrom) {
			m.CreatedFrom = c
		}
		if c.After(m.CreatedTo) {
			m.CreatedTo = c
		}
		if i == 0 || p.Before(m.PublishedFrom) {
			m.PublishedFrom = p
		}
		if p.After(m.PublishedTo) {
			m.PublishedTo = p
		}
	}
	return m
}

// digester computes an events digest (Manifest.EventsDigest): the SHA-256
// of a "seq id" line per event.
type digester struct {
	h hash.Hash
	b []byte
}

func newDigester() *digester { return &digester{h: sha256.New(), b: make([]byte, 0, 64)} }

func (d *digester) add(seq int64, id string) {
	d.b = strconv.AppendInt(d.b[:0], seq, 10)
	d.b = append(d.b, ' ')
	d.b = append(d.b, id...)
	d.b = append(d.b, '\n')
	d.h.Write(d.b)
}

func (d *digester) sum() string { return hex.EncodeToString(d.h.Sum(nil)) }

func eventsDigest(evs []core.Event) string {
	d := newDigester()
	for _, ev := range evs {
		d.add(ev.Seq, ev.ID)
	}
	return d.sum()
}

// record is one archived event: one line of an object.
type record struct {
	Seq           int64             `json:"seq"`
	ID            string            `json:"event_id"`
	AggregateType string            `json:"aggregate_type"`
	AggregateID   string            `json:"aggregate_id"`
	EventType     string            `json:"event_type"`
	Payload       json.RawMessage   `json:"payload"`
	Headers       map[string]string `json:"headers,omitempty"`
	CreatedAt     time.Time         `json:"created_at"`
	PublishedAt   *time.Time        `json:"published_at,omitempty"`
	AttemptCount  int               `json:"attempt_count"`
}

func recordOf(ev core.Event) record {
	return record{
		Seq: ev.Seq, ID: ev.ID, AggregateType: ev.AggregateType, AggregateID: ev.AggregateID,
		EventType: ev.EventType, Payload: ev.Payload, Headers: ev.Headers,
		CreatedAt: ev.CreatedAt.UTC(), PublishedAt: ev.PublishedAt, AttemptCount: ev.AttemptCount,
	}
}

func (r record) event() core.Event {
	return core.Event{
		Seq: r.Seq, ID: r.ID, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
		EventType: r.EventType, Payload: r.Payload, Headers: r.Headers,
		CreatedAt: r.CreatedAt, PublishedAt: r.PublishedAt, AttemptCount: r.AttemptCount,
	}
}

// encode returns the gzip-compressed JSON Lines of evs and their SHA-256.
func encode(evs []core.Event) ([]byte, string, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	enc := json.NewEncoder(zw)
	for _, ev := range evs {
		if err := enc.Encode(recordOf(ev)); err != nil {
			return nil, "", fmt.Errorf("archive: encode event %d: %w", ev.Seq, err)
		}
	}
	if err := zw.Close(); err != nil {
		return nil, "", fmt.Errorf("archive: compress: %w", err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), hex.EncodeToString(sum[:]), nil
}

func readManifest(ctx context.Context, b *blob.Bucket, name string) (Manifest, error) {
	var m Manifest
	data, err := b.ReadAll(ctx, name)
	if err != nil {
		return m, fmt.Errorf("archive: read manifest %s: %w", name, err)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("%w: manifest %s: %v", ErrCorrupt, name, err)
	}
	if m.Format != Format {
		return m, fmt.Errorf("%w: manifest %s has format %q, not %q", ErrCorrupt, name, m.Format, Format)
	}
	return m, nil
}

// verify reads m's object back and checks it against m: size, checksum,
// count and the events' digest.
func verify(ctx context.Context, b *blob.Bucket, m Manifest) error {
	n := 0
	d := newDigester()
	err := readObject(ctx, b, m, func(r record) error {
		n++
		d.add(r.Seq, r.ID)
		return nil
	})
	if err != nil {
		return err
	}
	if n != m.Count || d.sum() != m.EventsDigest {
		return fmt.Errorf("%w: %s holds %d events, its manifest %d (or other events)", ErrCorrupt, m.Object, n, m.Count)
	}
	return nil
}

// readObject streams the records of m's object to fn, checking its size
// and checksum once it has been read whole.
func readObject(ctx context.Context, b *blob.Bucket, m Manifest, fn func(record) error) error {
	r, err := b.NewReader(ctx, m.Object, nil)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return fmt.Errorf("%w: %s is missing", ErrCorrupt, m.Object)
		}
		return fmt.Errorf("archive: read %s: %w", m.Object, err)
	}
	defer r.Close()
	h := sha256.New()
	cr := &countingReader{r: io.TeeReader(r, h)}
	zr, err := gzip.NewReader(cr)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, m.Object, err)
	}
	dec := json.NewDecoder(zr)
	for {
		var rec record
		err := dec.Decode(&rec)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrCorrupt, m.Object, err)
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
	// Drain what gzip left unread (its trailer) into the checksum.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return fmt.Errorf("archive: read %s: %w", m.Object, err)
	}
	if cr.n != int64(m.Bytes) || hex.EncodeToString(h.Sum(nil)) != m.SHA256 {
		return fmt.Errorf("%w: %s: %d bytes with another checksum than its manifest's (%d bytes)", ErrCorrupt, m.Object, cr.n, m.Bytes)
	}
	return nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
