package archive_test

import (
	"context"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/archive"
)

// BenchmarkArchive archives 100k published events (~150-byte payloads) of
// a PostgreSQL outbox to a file:// bucket in batches of 10000, with every
// object read back and verified, and reports events/s and the archive's
// bytes per event.
func BenchmarkArchive(b *testing.B) {
	ctx := context.Background()
	const n = 100_000
	for b.Loop() {
		b.StopTimer()
		o := openOutboxTB(b, "postgres")
		if _, err := o.db.Exec(`INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, payload, published_at)
			SELECT gen_random_uuid(), 'order', (g % 1000)::text, 'order.created',
			jsonb_build_object('order_id', g, 'customer', 'c-' || (g % 977), 'total_cents', g * 7, 'note', repeat('x', 60)), now()
			FROM generate_series(1, $1) g`, n); err != nil {
			b.Fatal(err)
		}
		bucket, _ := openBucket(b)
		a, err := archive.New(o.ob, bucket, archive.Options{BatchSize: 10_000})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		res, err := a.ArchiveBefore(ctx, time.Now().Add(time.Minute), nil)
		if err != nil || res.Deleted != n {
			b.Fatalf("%+v, %v", res, err)
		}
		b.ReportMetric(n/time.Since(start).Seconds(), "events/s")
		b.StopTimer()
		ms, err := archive.NewReader(bucket, "").Manifests(ctx)
		if err != nil {
			b.Fatal(err)
		}
		var bytes int
		for _, m := range ms {
			bytes += m.Bytes
		}
		b.ReportMetric(float64(bytes)/n, "bytes/event")
		b.StartTimer()
	}
}
