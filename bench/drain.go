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
		{name: "a' relay drain, relay pool with synchronous_commit=off, vs raw SQL (sync on)", value: d.relayAsync, baseline: d.raw,
			unit: "/s", target: "—"},
	}
}

// memPublisher is the in-memory broker: it accepts every event.
type memPublisher struct{ n atomic.Int64 }

func (p *memPublisher) Publish(_ context.Context, evs []core.Event) error {
	p.n.Add(int64(len(evs)))
	return nil
}

// drain runs scenario a: the same backlog drained by txoutbox's relay over
// the sqlx store, and by a hand-written pgx loop of the same statements.
func (b *bench) drain(ctx context.Context) (drainResult, error) {
	var res drainResult
	if _, err := b.outbox(ctx, b.db, drainTable, sqlxoutbox.Options{}); err != nil {
		return res, err
	}
	asyncDB, err := b.open("synchronous_commit=off")
	if err != nil {
		return res, err
	}
	defer asyncDB.Close()
	for round := range b.c.Rounds {
		// Alternate who goes first, so that neither side always gets the
		// warmer cache or the quieter minute.
		order := []string{"raw", "relay", "async"}
		if round%2 == 1 {
			order = []string{"relay", "async", "raw"}
		}
		for _, who := range order {
			if err := b.fill(ctx, drainTable, b.c.Backlog); err != nil {
				return res, err
			}
			var rate float64
			var err error
			switch who {
			case "raw":
				rate, err = b.drainRaw(ctx)
				res.raw = max(res.raw, rate)
			case "relay":
				rate, err = b.drainRelay(ctx, b.db)
				res.relay = max(res.relay, rate)
			case "async":
				rate, err = b.drainRelay(ctx, asyncDB)
				res.relayAsync = max(res.relayAsync, rate)
			}
			if err != nil {
				return res, fmt.Errorf("%s drain: %w", who, err)
			}
			b.log.Info("drain", "round", round, "who", who, "events_per_s", int(rate))
		}
	}
	return res, nil
}

func (b *bench) drainRelay(ctx context.Context, db *sql.DB) (float64, error) {
	box, err := b.outbox(ctx, db, drainTable, sqlxoutbox.Options{})
	if err != nil {
		return 0, err
	}
	pub := &memPublisher{}
	relay, err := core.NewRelay(box, pub, core.RelayOptions{BatchSize: 100, Logger: b.quiet})
	if err != nil {
		return 0, err
	}
	start := time.Now()
	total, err := relay.Drain(ctx)
	el := time.Since(start)
	if err != nil {
		return 0, err
	}
	if total.Published != b.c.Backlog || pub.n.Load() != int64(b.c.Backlog) {
		return 0, fmt.Errorf("relay published %d (publisher saw %d) of %d", total.Published, pub.n.Load(), b.c.Backlog)
	}
	return float64(total.Published) / el.Seconds(), nil
}

// rawClaim is the claim of the sqlx store written out by hand: the same
// rows, the same index, the same lock, but scanned by pgx directly.
const rawClaim = "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, attempt_count" +
	" FROM " + drainTable + " WHERE published_at IS NULL AND dead_at IS NULL AND next_attempt_at <= statement_timestamp()" +
	" ORDER BY next_attempt_at, id LIMIT 100 FOR UPDATE SKIP LOCKED"

const rawMark = "UPDATE " + drainTable + " SET published_at = statement_timestamp(), attempt_count = attempt_count + 1 WHERE id = ANY($1)"

// drainRaw is the baseline: BEGIN; claim; UPDATE ... = ANY; COMMIT on one
// pgx connection, with no framework at all.
func (b *bench) drainRaw(ctx context.Context) (float64, error) {
	conn, err := pgx.Connect(ctx, b.dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	start := time.Now()
	n, err := rawDrain(ctx, conn, 0)
	el := time.Since(start)
	if err != nil {
		return 0, err
	}
	if n != b.c.Backlog {
		return 0, fmt.Errorf("raw loop marked %d of %d", n, b.c.Backlog)
	}
	return float64(n) / el.Seconds(), nil
}

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
