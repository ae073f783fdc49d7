package main

import (
	"context"
	"fmt"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
)

// bloat runs scenario e: the latency of a claim (BEGIN, the SKIP LOCKED
// SELECT of ClaimBatchSize events, ROLLBACK) on a table holding Pending due
// events and nothing else, and on one holding the same plus Retained
// published events, written with one INSERT ... SELECT and vacuumed, as
// retention leaves them between cleanups. The retained rows share one small
// payload, which keeps writing millions of them within a minute or two on a
// small machine; the claim never reads them (it reads the partial index of
// due events), so their size is not what is measured.
func (b *bench) bloat(ctx context.Context) ([]row, error) {
	empty, err := b.outbox(ctx, b.db, "bloat_empty", sqlxoutbox.Options{})
	if err != nil {
		return nil, err
	}
	full, err := b.outbox(ctx, b.db, "bloat_retained", sqlxoutbox.Options{})
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if _, err := b.db.ExecContext(ctx, "INSERT INTO bloat_retained"+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, created_at, published_at, attempt_count, next_attempt_at)"+
		" SELECT gen_random_uuid(), 'order', 'o-' || (g % 1000), 'order.created', CAST($2 AS jsonb),"+
		" now() - interval '7 days' + g * interval '100 microseconds', now() - interval '7 days' + g * interval '100 microseconds', 1,"+
		" now() - interval '7 days' + g * interval '100 microseconds'"+
		" FROM generate_series(1, $1) AS g", b.c.Retained, `{"order_id": "o-1", "status": "created"}`); err != nil {
		return nil, fmt.Errorf("write %d retained rows: %w", b.c.Retained, err)
	}
	b.log.Info("bloat: retained rows written", "rows", b.c.Retained, "took", time.Since(start))
	for _, t := range []string{"bloat_empty", "bloat_retained"} {
		if _, err := b.db.ExecContext(ctx, "INSERT INTO "+t+" (event_id, aggregate_type, aggregate_id, event_type, payload)"+
			" SELECT gen_random_uuid(), 'order', 'o-' || (g % 1000), 'order.created', "+payloadSQL("g")+
			" FROM generate_series(1, $1) AS g", b.c.Pending); err != nil {
			return nil, err
		}
		if _, err := b.db.ExecContext(ctx, "VACUUM ANALYZE "+t); err != nil {
			return nil, err
		}
	}
	b.log.Info("bloat: tables ready", "took", time.Since(start))

	de, df, err := b.claimLatencies(ctx, empty, full)
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("e  claim latency p50, %s published rows retained vs empty table (%d pending, batch %d)",
		count(b.c.Retained), b.c.Pending, b.c.ClaimBatchSize)
	p50e, p50f := ms(percentile(de, 0.5)), ms(percentile(df, 0.5))
	return []row{
		{name: name, value: p50f, baseline: p50e, unit: "ms", ratioX: true, target: "≤ 2×", pass: p50f <= 2*p50e, verdict: true},
		{name: "e  claim latency p99, same tables", value: ms(percentile(df, 0.99)), baseline: ms(percentile(de, 0.99)), unit: "ms", ratioX: true, target: "—"},
	}, nil
}

func count(n int) string {
	switch {
	case n >= 1_000_000 && n%100_000 == 0:
		return fmt.Sprintf("%gM", float64(n)/1e6)
	case n >= 1000 && n%100 == 0:
		return fmt.Sprintf("%gk", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

// claimLatencies times ClaimSamples claims (and releases) of ClaimBatchSize
// events on each of two stores, taking turns so that a noisy second hits
// both alike, after 20 of warm-up.
func (b *bench) claimLatencies(ctx context.Context, empty, full core.Store) (de, df []time.Duration, err error) {
	claim := func(s core.Store) (time.Duration, error) {
		t0 := time.Now()
		c, err := s.Claim(ctx, core.ClaimRequest{Limit: b.c.ClaimBatchSize})
		if err != nil {
			return 0, err
		}
		d := time.Since(t0)
		if n := len(c.Events()); n != b.c.ClaimBatchSize {
			return 0, fmt.Errorf("claimed %d events, want %d", n, b.c.ClaimBatchSize)
		}
		return d, c.Release(ctx)
	}
	for i := range b.c.ClaimSamples + 20 {
		e, err := claim(empty)
		if err != nil {
			return nil, nil, err
		}
		f, err := claim(full)
		if err != nil {
			return nil, nil, err
		}
		if i >= 20 {
			de, df = append(de, e), append(df, f)
		}
	}
	return de, df, nil
}
