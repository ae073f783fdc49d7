package logrelay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/logstream"
)

// pgTable is the outbox table of the retry path: the trigger keeps out
// every row but those written under relaySetting.
type pgTable struct {
	pool   *pgxpool.Pool
	insert string
	heldQ  string
}

func newPGTable(pool *pgxpool.Pool, names resolved, ropts core.RelayOptions) *pgTable {
	t := &pgTable{
		pool: pool,
		insert: `INSERT INTO ` + names.quotedTable + ` (id, event_id, aggregate_type, aggregate_id, event_type, payload, headers,
			created_at, attempt_count, last_error, next_attempt_at, dead_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, GREATEST(now() + $11 * interval '1 microsecond', $13), CASE WHEN $12 THEN now() END)
			ON CONFLICT (id) DO NOTHING`,
		// A scheduled row holds nothing back.
		heldQ: `SELECT DISTINCT aggregate_id FROM ` + names.quotedTable + ` WHERE published_at IS NULL AND aggregate_id <> ''` +
			` AND NOT (attempt_count = 0 AND next_attempt_at > now())`,
	}
	if ropts.Ordered.DeadLetter == core.DeadLetterSkip {
		t.heldQ += ` AND dead_at IS NULL`
	}
	return t
}

// Write writes rows under relaySetting, so that the trigger keeps them, in
// one transaction; rows already there (written before a crash, then
// streamed again) are left as they are.
func (t *pgTable) Write(ctx context.Context, rows []logstream.Row) error {
	return pgx.BeginFunc(ctx, t.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue("SELECT set_config('" + relaySetting + "', 'on', true)")
		for _, r := range rows {
			ev := r.Event
			headers := ev.Headers
			if headers == nil {
				headers = map[string]string{}
			}
			attempts, lastErr, retryIn, dead := 0, (*string)(nil), int64(0), false
			if f := r.Failure; f != nil {
				attempts, lastErr, retryIn, dead = 1, &f.Err, f.RetryIn.Microseconds(), f.Dead
			}
			var notBefore *time.Time // GREATEST ignores NULL
			if r.Failure == nil && !ev.NotBefore.IsZero() {
				notBefore = &ev.NotBefore
			}
			b.Queue(t.insert, ev.Seq, ev.ID, ev.AggregateType, ev.AggregateID, ev.EventType, []byte(ev.Payload), headers,
				ev.CreatedAt, attempts, lastErr, retryIn, dead, notBefore)
		}
		return tx.SendBatch(ctx, b).Close()
	})
}

// Held returns the aggregates that have unpublished rows in the table.
func (t *pgTable) Held(ctx context.Context) ([]string, error) {
	rows, err := t.pool.Query(ctx, t.heldQ)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
