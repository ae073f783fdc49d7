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

// drainResult holds the best rate of each side of scenario a, events/s.
type drainResult struct {
	relay, raw, relayAsync float64
}

func (d drainResult) rows() []row {
	return []row{
		{name: "a  relay drain vs raw SQL claim+mark (events/s, batch 100, 1 worker)", value: d.relay, baseline: d.raw,
			unit: "/s", target: "≥ 90 %", pass: d.relay >= 0.9*d.raw, verdict: true},
		{name: "a' relay drain with AsyncMark (synchronous_commit=off marks) vs raw SQL (sync on)", value: d.relayAsync, baseline: d.raw,
			unit: "/s", target: "—"},
	}
}

// memPublisher is the in-memory broker: it accepts every event.
type memPublisher struct{ n atomic.Int64 }

func (p *memPublisher) Publish(_ context.Context, evs []core.Event) error {
	p.n.Add(int64(len(evs)))
	return nil
}

// drain runs scenario a: one backlog drained by three sides taking turns
// batch by batch — txoutbox's relay over the sqlx store, the same relay
// with AsyncMark (marks committed with synchronous_commit off), and a hand-written pgx loop of the
// same statements — each side's rate being its events over the time spent
// in its own batches. Taking turns every few milliseconds exposes all sides
// to the same load of a shared machine, which separate runs a minute apart
// do not.
func (b *bench) drain(ctx context.Context) (drainResult, error) {
	var res drainResult
	if _, err := b.outbox(ctx, b.db, drainTable, sqlxoutbox.Options{}); err != nil {
		return res, err
	}
	relaySync, err := b.drainRelay(ctx, b.db, sqlxoutbox.Options{})
	if err != nil {
		return res, err
	}
	relayAsync, err := b.drainRelay(ctx, b.db, sqlxoutbox.Options{AsyncMark: true})
	if err != nil {
		return res, err
	}
	conn, err := pgx.Connect(ctx, b.dsn)
	if err != nil {
		return res, err
	}
	defer conn.Close(context.Background())
	sides := []struct {
		name   string
		batch  func() (int, error)
		events int
		spent  time.Duration
	}{
		{name: "raw", batch: func() (int, error) { return rawDrain(ctx, conn, 1) }},
		{name: "relay", batch: relaySync},
		{name: "async", batch: relayAsync},
	}
	for round := range b.c.Rounds {
		if err := b.fill(ctx, drainTable, b.c.Backlog); err != nil {
			return res, err
		}
		total := 0
	turns:
		for turn := 0; ; turn++ {
			// Rotate who goes first, so that no side always follows the
			// same one.
			for k := range sides {
				s := &sides[(turn+k)%len(sides)]
				t0 := time.Now()
				n, err := s.batch()
				if err != nil {
					return res, fmt.Errorf("%s batch: %w", s.name, err)
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
			return res, fmt.Errorf("round %d drained %d of %d events", round, total, b.c.Backlog)
		}
		b.log.Info("drain", "round", round, "raw", sides[0].events, "relay", sides[1].events, "async", sides[2].events)
	}
	rate := func(i int) float64 { return float64(sides[i].events) / sides[i].spent.Seconds() }
	res.raw, res.relay, res.relayAsync = rate(0), rate(1), rate(2)
	return res, nil
}

// drainRelay returns one relay batch on an Outbox over db: claim, publish
// to memory, mark, commit; it returns the events published.
func (b *bench) drainRelay(ctx context.Context, db *sql.DB, opts sqlxoutbox.Options) (func() (int, error), error) {
	box, err := b.outbox(ctx, db, drainTable, opts)
	if err != nil {
		return nil, err
	}
	relay, err := core.NewRelay(box, &memPublisher{}, core.RelayOptions{BatchSize: 100, Logger: b.quiet})
	if err != nil {
		return nil, err
	}
	return func() (int, error) {
		res, err := relay.ProcessBatch(ctx)
		if err == nil && res.Published != res.Claimed {
			err = fmt.Errorf("relay published %d of %d claimed", res.Published, res.Claimed)
		}
		return res.Published, err
	}, nil
}

// rawClaim is the claim of the sqlx store written out by hand: the same
// rows, the same index, the same lock, but scanned by pgx directly.
const rawClaim = "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, attempt_count" +
	" FROM " + drainTable + " WHERE published_at IS NULL AND dead_at IS NULL AND next_attempt_at <= statement_timestamp()" +
	" ORDER BY next_attempt_at, id LIMIT 100 FOR UPDATE SKIP LOCKED"

const rawMark = "UPDATE " + drainTable + " SET published_at = statement_timestamp(), attempt_count = attempt_count + 1 WHERE id = ANY($1)"

// rawDrain claims and marks batches until a claim is empty or limit
// batches are done (0: no limit), and returns the events marked.
func rawDrain(ctx context.Context, conn *pgx.Conn, limit int) (int, error) {
	total := 0
	ids := make([]int64, 0, 100)
	for batches := 0; limit == 0 || batches < limit; batches++ {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return total, err
		}
		rows, err := tx.Query(ctx, rawClaim)
		if err != nil {
			_ = tx.Rollback(ctx)
			return total, err
		}
		ids = ids[:0]
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
				_ = tx.Rollback(ctx)
				return total, err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			_ = tx.Rollback(ctx)
			return total, err
		}
		if len(ids) == 0 {
			return total, tx.Rollback(ctx)
		}
		if _, err := tx.Exec(ctx, rawMark, ids); err != nil {
			_ = tx.Rollback(ctx)
			return total, err
		}
		if err := tx.Commit(ctx); err != nil {
			return total, err
		}
		total += len(ids)
	}
	return total, nil
}
