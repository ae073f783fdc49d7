package main

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
)

const drainTable = "drain_events"

// drainResult holds the rate of each side of scenario a, events/s.
type drainResult struct {
	relay, raw, relaySync, rawSync, textbook float64
	// Delete on publish, written by hand: claim and delete in one
	// statement, and the textbook's lock then DELETE, against the same
	// loops that mark (all with asynchronous commit).
	rawDelete, lockDelete, lockMark float64
	// relayDelete is the relay over a store with DeleteOnPublish.
	relayDelete float64
}

func (d drainResult) rows() []row {
	return []row{
		{name: "a  relay drain vs raw SQL claim+mark (events/s, batch 100, 1 worker)", value: d.relay, baseline: d.raw,
			unit: "/s", target: "≥ 90 %", pass: d.relay >= 0.9*d.raw, verdict: true},
		{name: "a' relay drain with SyncMark (marks wait for the WAL flush) vs raw SQL, same statement", value: d.relaySync, baseline: d.rawSync,
			unit: "/s", target: "—"},
		{name: "a'' relay drain vs the textbook raw loop (SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE ... WHERE id = ANY)", value: d.relay, baseline: d.textbook,
			unit: "/s", target: "—"},
		{name: "a''' relay drain with DeleteOnPublish vs the relay that marks (its default)", value: d.relayDelete, baseline: d.relay,
			unit: "/s", target: "—"},
		{name: "a''' relay drain with DeleteOnPublish vs lock, then DELETE by hand (the textbook loop: the store reads every column, the loop nine)", value: d.relayDelete, baseline: d.lockDelete,
			unit: "/s", target: "—"},
		{name: "a''' delete on publish, by hand: claim and DELETE in one statement vs raw SQL claim+mark (both asynchronous commit)", value: d.rawDelete, baseline: d.raw,
			unit: "/s", target: "—"},
		{name: "a''' delete on publish, by hand: lock, then DELETE vs lock, then UPDATE (the textbook loop, both asynchronous commit)", value: d.lockDelete, baseline: d.lockMark,
			unit: "/s", target: "—"},
	}
}

// memPublisher is the in-memory broker: it accepts every event. It notes
// when its first call came and how many events that call had, for the
// streaming rate of a drain (log mode: first event to last).
type memPublisher struct {
	n               atomic.Int64
	firstAt, firstN atomic.Int64
}

func (p *memPublisher) Capabilities() core.PublisherCapabilities { return core.PublisherCapabilities{} }

func (p *memPublisher) Publish(_ context.Context, evs []core.Event) error {
	if p.firstAt.CompareAndSwap(0, time.Now().UnixNano()) {
		p.firstN.Store(int64(len(evs)))
	}
	p.n.Add(int64(len(evs)))
	return nil
}

// streamed returns the time of the first publish and the rate from there
// to end, over the events after the first call's.
func (p *memPublisher) streamed(end time.Time) (time.Time, float64) {
	first := time.Unix(0, p.firstAt.Load())
	return first, float64(p.n.Load()-p.firstN.Load()) / end.Sub(first).Seconds()
}

// drain runs scenario a: one backlog drained by five sides taking turns
// batch by batch — txoutbox's relay over the sqlx store (marks committed
// asynchronously, its default), the same relay with SyncMark, hand-written
// pgx loops of the same claim statements (asynchronous and synchronous),
// and the textbook loop — each side's rate being its events over the time
// spent in its own batches. Taking turns every few milliseconds exposes all
// sides to the same load of a shared machine, which separate runs a minute
// apart do not.
func (b *bench) drain(ctx context.Context) (drainResult, error) {
	var res drainResult
	if _, err := b.outbox(ctx, b.db, drainTable, sqlxoutbox.Options{}); err != nil {
		return res, err
	}
	relay, err := b.drainRelay(ctx, b.db, sqlxoutbox.Options{})
	if err != nil {
		return res, err
	}
	relaySync, err := b.drainRelay(ctx, b.db, sqlxoutbox.Options{SyncMark: true})
	if err != nil {
		return res, err
	}
	relayDelete, err := b.drainRelay(ctx, b.db, sqlxoutbox.Options{DeleteOnPublish: true})
	if err != nil {
		return res, err
	}
	conn, err := pgx.Connect(ctx, b.dsn)
	if err != nil {
		return res, err
	}
	defer conn.Close(context.Background())
	sides := []drainSide{
		{name: "raw", batch: func() (int, error) { return rawDrain(ctx, conn, rawClaimAsync, 1) }},
		{name: "relay", batch: relay},
		{name: "relay_sync", batch: relaySync},
		{name: "raw_sync", batch: func() (int, error) { return rawDrain(ctx, conn, rawClaim, 1) }},
		{name: "textbook", batch: func() (int, error) { return textbookDrain(ctx, conn, textbookMark) }},
		{name: "raw_delete", batch: func() (int, error) { return rawDrain(ctx, conn, rawClaimDeleteAsync, 1) }},
		{name: "lock_delete", batch: func() (int, error) { return textbookDrain(ctx, conn, textbookDeleteAsync) }},
		{name: "lock_mark", batch: func() (int, error) { return textbookDrain(ctx, conn, textbookMarkAsync) }},
		{name: "relay_delete", batch: relayDelete},
	}
	if err := b.takeTurns(ctx, "drain", b.filler(drainTable), sides); err != nil {
		return res, err
	}
	res.raw, res.relay, res.relaySync, res.rawSync, res.textbook = sides[0].rate(), sides[1].rate(), sides[2].rate(), sides[3].rate(), sides[4].rate()
	res.rawDelete, res.lockDelete, res.lockMark, res.relayDelete = sides[5].rate(), sides[6].rate(), sides[7].rate(), sides[8].rate()
	return res, nil
}

// drainSide is one way of draining a backlog, a batch per call.
type drainSide struct {
	name   string
	batch  func() (int, error) // one batch; the events it drained
	events int
	spent  time.Duration
}

// rate is the side's events per second of its own time.
func (s *drainSide) rate() float64 { return float64(s.events) / s.spent.Seconds() }

// filler returns the fill of a PostgreSQL table of the bench database.
func (b *bench) filler(table string) func(ctx context.Context, n int) error {
	return func(ctx context.Context, n int) error { return b.fill(ctx, table, n) }
}

// takeTurns fills the table with Backlog events and has the sides drain it
// batch by batch, taking turns, once per round.
func (b *bench) takeTurns(ctx context.Context, what string, fill func(ctx context.Context, n int) error, sides []drainSide) error {
	for round := range b.c.Rounds {
		if err := fill(ctx, b.c.Backlog); err != nil {
			return err
		}
		total := 0
	turns:
		for turn := 0; ; turn++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			// Rotate who goes first, so that no side always follows the
			// same one.
			for k := range sides {
				s := &sides[(turn+k)%len(sides)]
				t0 := time.Now()
				n, err := s.batch()
				if err != nil {
					return fmt.Errorf("%s batch: %w", s.name, err)
				}
				if n == 0 {
					break turns
				}
				s.spent += time.Since(t0)
				s.events += n
				total += n
			}
		}
		if total != b.c.Backlog {
			return fmt.Errorf("round %d drained %d of %d events", round, total, b.c.Backlog)
		}
		args := []any{"round", round}
		for _, s := range sides {
			args = append(args, s.name, s.events)
		}
		b.log.Info(what, args...)
	}
	return nil
}

// drainRelay returns one relay batch on an Outbox over db: claim, publish
// to memory, mark, commit; it returns the events published.
func (b *bench) drainRelay(ctx context.Context, db *sql.DB, opts sqlxoutbox.Options) (func() (int, error), error) {
	box, err := b.outbox(ctx, db, drainTable, opts)
	if err != nil {
		return nil, err
	}
	return b.relayBatch(ctx, box)
}

// relayBatch returns one relay batch on store.
func (b *bench) relayBatch(ctx context.Context, store core.Store) (func() (int, error), error) {
	relay, err := core.NewRelay(store, &memPublisher{}, core.RelayOptions{BatchSize: 100, Logger: b.quiet})
	if err != nil {
		return nil, err
	}
	return func() (int, error) {
		res, err := relay.ProcessBatch(ctx)
		if err == nil && res.Published != res.Claimed {
			err = fmt.Errorf("relay published %d of %d claimed", res.Published, res.Claimed)
		}
		return int(res.Published), err
	}, nil
}

// rawClaim is the claim of the sqlx store written out by hand: the same
// statement (dialect.Queries.ClaimMarked, which locks the rows and marks
// them published in one go), the same index, the same lock, but scanned by
// pgx directly into locals instead of going through the store into
// core.Event, and without the relay's bookkeeping. rawClaimAsync is the
// statement the store runs by default, which also turns synchronous_commit
// off for its transaction.
const (
	rawClaim      = rawClaimHead + rawClaimTail
	rawClaimAsync = rawClaimHead + ", (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit" + rawClaimTail
	rawClaimHead  = "WITH claimed AS (SELECT id FROM " + drainTable +
		" WHERE published_at IS NULL AND dead_at IS NULL AND next_attempt_at <= statement_timestamp()" +
		" ORDER BY next_attempt_at, id LIMIT 100 FOR UPDATE SKIP LOCKED)" +
		" UPDATE " + drainTable + " AS o SET published_at = statement_timestamp(), attempt_count = o.attempt_count + 1" +
		" FROM claimed"
	rawClaimTail = " WHERE o.id = claimed.id" +
		" RETURNING o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers, o.created_at," +
		" CAST(NULL AS timestamptz), o.attempt_count - 1, o.last_error, o.next_attempt_at, o.dead_at"
)

// rawDrain claims and marks batches until a claim is empty or limit
// batches are done (0: no limit), and returns the events marked: BEGIN,
// the claim, COMMIT once the (in-memory, instant) publish is done.
func rawDrain(ctx context.Context, conn *pgx.Conn, claim string, limit int) (int, error) {
	total := 0
	for batches := 0; limit == 0 || batches < limit; batches++ {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return total, err
		}
		rows, err := tx.Query(ctx, claim)
		if err != nil {
			_ = tx.Rollback(ctx)
			return total, err
		}
		var (
			n                int
			id               int64
			eid              pgtype.UUID
			at, aid, et      string
			payload, headers []byte
			created, next    time.Time
			published, dead  pgtype.Timestamptz
			attempts         int32
			lastError        pgtype.Text
		)
		for rows.Next() {
			if err := rows.Scan(&id, &eid, &at, &aid, &et, &payload, &headers, &created, &published, &attempts, &lastError, &next, &dead); err != nil {
				rows.Close()
				_ = tx.Rollback(ctx)
				return total, err
			}
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			_ = tx.Rollback(ctx)
			return total, err
		}
		if n == 0 {
			return total, tx.Rollback(ctx)
		}
		if err := tx.Commit(ctx); err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// textbookClaim and textbookMark are the relay batch as it is usually
// written, and as ../shared/design/PERFORMANCE-LIMITS.md measured it: lock
// the rows, publish, mark them, four round trips and two passes over the
// rows.
const textbookClaim = "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, attempt_count" +
	" FROM " + drainTable + " WHERE published_at IS NULL AND dead_at IS NULL AND next_attempt_at <= statement_timestamp()" +
	" ORDER BY next_attempt_at, id LIMIT 100 FOR UPDATE SKIP LOCKED"

const textbookMark = "UPDATE " + drainTable + " SET published_at = statement_timestamp(), attempt_count = attempt_count + 1 WHERE id = ANY($1)"

// asyncCommit, joined into a statement, turns synchronous_commit off for
// the rest of its transaction, as the store's marks do.
const asyncCommit = "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"

// textbookMarkAsync and textbookDeleteAsync are the textbook loop's second
// statement with asynchronous commit: marking the rows, or deleting them
// (delete on publish).
const (
	textbookMarkAsync = "UPDATE " + drainTable + " SET published_at = statement_timestamp(), attempt_count = attempt_count + 1" +
		" FROM " + asyncCommit + " WHERE id = ANY($1)"
	textbookDeleteAsync = "DELETE FROM " + drainTable + " USING " + asyncCommit + " WHERE id = ANY($1)"
)

// rawClaimDeleteAsync claims and deletes in one statement: the least a
// delete on publish can cost, though a store could not run it as is (a
// failed publish would have to insert its deleted row back).
const rawClaimDeleteAsync = "WITH claimed AS (SELECT id FROM " + drainTable +
	" WHERE published_at IS NULL AND dead_at IS NULL AND next_attempt_at <= statement_timestamp()" +
	" ORDER BY next_attempt_at, id LIMIT 100 FOR UPDATE SKIP LOCKED)" +
	" DELETE FROM " + drainTable + " AS o USING claimed, " + asyncCommit +
	" WHERE o.id = claimed.id" +
	" RETURNING o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers, o.created_at," +
	" o.published_at, o.attempt_count, o.last_error, o.next_attempt_at, o.dead_at"

// textbookDrain runs one textbook batch, with mark as its second statement
// (the claimed IDs its one argument), and returns the events marked.
func textbookDrain(ctx context.Context, conn *pgx.Conn, mark string) (int, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, textbookClaim)
	if err != nil {
		return 0, err
	}
	ids := make([]int64, 0, 100)
	var (
		id               int64
		eid              pgtype.UUID
		at, aid, et      string
		payload, headers []byte
		created          time.Time
		attempts         int32
	)
	for rows.Next() {
		if err := rows.Scan(&id, &eid, &at, &aid, &et, &payload, &headers, &created, &attempts); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if _, err := tx.Exec(ctx, mark, ids); err != nil {
		return 0, err
	}
	return len(ids), tx.Commit(ctx)
}
