package archive_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/blob/fileblob"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/archive"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/testing/sqlfixture"
)

// backends are the databases every archive test runs on.
var backends = []string{"postgres", "mysql", "sqlite"}

// outbox is one fresh, migrated outbox for a test.
type outbox struct {
	db    *sql.DB
	d     dialect.Dialect
	table string // quoted
	name  string
	ob    *sqlxoutbox.Outbox
}

func openOutbox(t *testing.T, backend string) *outbox { return openOutboxTB(t, backend) }

func openOutboxTB(t testing.TB, backend string) *outbox {
	t.Helper()
	var fx *sqlfixture.DB
	switch backend {
	case "postgres":
		fx = sqlfixture.Open(t, testenv.Env(t, "TXOUTBOX_PG_DSN"), sqlfixture.Options{SkipInbox: true})
	case "mysql":
		fx = sqlfixture.Open(t, testenv.Env(t, "TXOUTBOX_MYSQL_DSN"), sqlfixture.Options{SkipInbox: true})
	default:
		fx = sqlfixture.Open(t, "sqlite:", sqlfixture.Options{SkipInbox: true})
	}
	ob, err := sqlxoutbox.NewDB(fx.DB, sqlxoutbox.Options{Dialect: fx.Dialect, Table: fx.Table.String()})
	if err != nil {
		t.Fatal(err)
	}
	return &outbox{db: fx.DB, d: fx.Dialect, table: fx.Dialect.Quote(fx.Table), name: fx.Table.String(), ob: ob}
}

// produce enqueues n events, spread over three aggregates and two types,
// in transactions of 50, and returns their IDs in Seq order.
func (o *outbox) produce(t *testing.T, n int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for done := 0; done < n; {
		tx, err := o.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var evs []core.Event
		for i := 0; i < 50 && done < n; i++ {
			evs = append(evs, core.Event{
				AggregateType: "order", AggregateID: fmt.Sprint(done % 3),
				EventType: []string{"order.created", "order.paid"}[done%2],
				Payload:   []byte(fmt.Sprintf(`{"n":%d,"note":"caf\u00e9"}`, done)),
				Headers:   map[string]string{"tenant": "t1"},
			})
			done++
		}
		if err := o.ob.Enqueue(ctx, tx, evs...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			ids = append(ids, ev.ID)
		}
	}
	return ids
}

// exec runs SQL written with ? placeholders.
func (o *outbox) exec(t *testing.T, query string, args ...any) {
	t.Helper()
	if o.d == dialect.Postgres {
		for i := 1; strings.Contains(query, "?"); i++ {
			query = strings.Replace(query, "?", fmt.Sprintf("$%d", i), 1)
		}
	}
	if _, err := o.db.Exec(query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// publishAll marks every event published when it was created, and the
// events of the given IDs published days earlier (by their creation).
func (o *outbox) publishAll(t *testing.T) {
	t.Helper()
	o.exec(t, "UPDATE "+o.table+" SET published_at = created_at")
}

func (o *outbox) count(t *testing.T, where string) int {
	t.Helper()
	var n int
	if err := o.db.QueryRow("SELECT count(*) FROM " + o.table + " WHERE " + where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func openBucket(t testing.TB) (*blob.Bucket, string) {
	t.Helper()
	dir := t.TempDir()
	b, err := fileblob.OpenBucket(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, dir
}

// archived reads the whole archive back, in order, and fails the test on
// any error.
func archived(t *testing.T, b *blob.Bucket, prefix string) []core.Event {
	t.Helper()
	var evs []core.Event
	err := archive.NewReader(b, prefix).Events(context.Background(), archive.Filter{All: true}, func(ev core.Event) error {
		evs = append(evs, ev)
		return nil
	})
	if err != nil {
		t.Fatalf("read the archive back: %v", err)
	}
	return evs
}

func idsOf(evs []core.Event) []string {
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	return ids
}

func manifestTotal(t *testing.T, b *blob.Bucket, prefix string) (objects, events int) {
	t.Helper()
	ms, err := archive.NewReader(b, prefix).Manifests(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		events += m.Count
	}
	return len(ms), events
}

// TestArchiveMovesPublishedEventsOnly: published events past the cut-off
// go to the bucket, one object per day and batch, and leave the table;
// pending, dead and recent events stay, and the archive reads back exactly
// the events written, in order, with their payloads and headers.
func TestArchiveMovesPublishedEventsOnly(t *testing.T) {
	t.Parallel()
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			o := openOutbox(t, backend)
			ids := o.produce(t, 230)
			o.publishAll(t)
			// Two days back for the first 100, one for the next 100.
			for i, id := range ids[:200] {
				age := 24 * time.Hour
				if i < 100 {
					age = 48 * time.Hour
				}
				if err := sqlfixture.Backdate(ctx, o.db, o.d, o.name, id, age); err != nil {
					t.Fatal(err)
				}
			}
			// Of the last 30: 10 pending, 10 dead, 10 published just now.
			o.exec(t, "UPDATE "+o.table+" SET published_at = NULL WHERE event_id IN (?,?,?,?,?,?,?,?,?,?)", anys(ids[200:210])...)
			o.exec(t, "UPDATE "+o.table+" SET published_at = NULL, dead_at = created_at WHERE event_id IN (?,?,?,?,?,?,?,?,?,?)", anys(ids[210:220])...)

			b, _ := openBucket(t)
			a, err := archive.New(o.ob, b, archive.Options{BatchSize: 64, Prefix: "orders"})
			if err != nil {
				t.Fatal(err)
			}
			var progress []int64
			res, err := a.ArchiveBefore(ctx, time.Now().Add(-time.Hour), func(r archive.Result) { progress = append(progress, r.Deleted) })
			if err != nil {
				t.Fatal(err)
			}
			if res.Events != 200 || res.Deleted != 200 || res.Reused != 0 {
				t.Fatalf("result %+v, want 200 events archived and deleted", res)
			}
			// 64-event batches over two days: 64 | 36+28 | 64 | 8 → 5 objects.
			if res.Objects != 5 || !slices.Equal(progress, []int64{64, 128, 192, 200}) {
				t.Fatalf("objects %d, progress %v: want 5 objects, progress 64,128,192,200", res.Objects, progress)
			}
			if n := o.count(t, "1=1"); n != 30 {
				t.Fatalf("%d rows left, want the 30 pending, dead and recent ones", n)
			}
			got := archived(t, b, "orders")
			if !slices.Equal(idsOf(got), ids[:200]) {
				t.Fatalf("archive holds %d events, not the 200 archived ones in order", len(got))
			}
			for _, ev := range got {
				if ev.Headers["tenant"] != "t1" || !strings.Contains(string(ev.Payload), `"café"`) && !strings.Contains(string(ev.Payload), `caf\u00e9`) ||
					ev.PublishedAt == nil || ev.AggregateType != "order" || ev.Seq == 0 {
					t.Fatalf("event read back lost a field: %+v", ev)
				}
			}
			ms, err := archive.NewReader(b, "orders").Manifests(ctx)
			if err != nil {
				t.Fatal(err)
			}
			day := time.Now().UTC().Add(-48 * time.Hour).Format("2006/01/02/")
			if !strings.HasPrefix(ms[0].Object, "orders/"+day) || ms[0].Count != 64 || ms[0].FirstSeq > ms[0].LastSeq {
				t.Fatalf("first manifest %+v: want 64 events under orders/%s", ms[0], day)
			}
			// Nothing left to do: a second run archives nothing.
			res, err = a.ArchiveBefore(ctx, time.Now().Add(-time.Hour), nil)
			if err != nil || res != (archive.Result{}) {
				t.Fatalf("second run: %+v, %v", res, err)
			}
		})
	}
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// crashPoints are where an archiving process can die with work half done.
var crashPoints = []string{"after-object", "after-manifest", "before-delete", "after-delete"}

// TestCrashAtEveryPointLosesNothing: a step stopped at each point where a
// process can die, then a fresh run, leaves every event in the archive
// exactly once (no second copy) and none in the table.
func TestCrashAtEveryPointLosesNothing(t *testing.T) {
	t.Parallel()
	for _, backend := range backends {
		for _, point := range crashPoints {
			t.Run(backend+"/"+point, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				o := openOutbox(t, backend)
				ids := o.produce(t, 120)
				o.publishAll(t)
				b, _ := openBucket(t)
				a, err := archive.New(o.ob, b, archive.Options{BatchSize: 50})
				if err != nil {
					t.Fatal(err)
				}
				errKilled := errors.New("killed")
				hits := 0
				archive.SetCrash(a, func(p string) error {
					if p == point {
						hits++
						if hits == 2 { // the second batch: the first is done
							return errKilled
						}
					}
					return nil
				})
				cutoff := time.Now().Add(time.Minute)
				if _, err := a.ArchiveBefore(ctx, cutoff, nil); !errors.Is(err, errKilled) {
					t.Fatalf("the crashing run returned %v, want it killed at %s", err, point)
				}
				// The next process.
				b2, err := archive.New(o.ob, b, archive.Options{BatchSize: 50})
				if err != nil {
					t.Fatal(err)
				}
				res, err := b2.ArchiveBefore(ctx, cutoff, nil)
				if err != nil {
					t.Fatal(err)
				}
				if n := o.count(t, "1=1"); n != 0 {
					t.Fatalf("%d rows left after the second run", n)
				}
				if got := archived(t, b, ""); !slices.Equal(idsOf(got), ids) {
					t.Fatalf("archive holds %d events, want the 120 in order", len(got))
				}
				objects, events := manifestTotal(t, b, "")
				if objects != 3 || events != 120 {
					t.Fatalf("%d objects holding %d events: a second copy was written", objects, events)
				}
				switch point {
				case "after-manifest", "before-delete":
					if res.Reused != 1 {
						t.Fatalf("second run %+v: want the object of the killed step reused", res)
					}
				}
			})
		}
	}
}

// TestVerifyCatchesACorruptObject: an object that no longer matches its
// manifest is an error on reading, and an archiver that meets one from an
// interrupted run writes it again instead of trusting it.
func TestVerifyCatchesACorruptObject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := openOutbox(t, "sqlite")
	ids := o.produce(t, 40)
	o.publishAll(t)
	b, dir := openBucket(t)
	a, err := archive.New(o.ob, b, archive.Options{BatchSize: 40})
	if err != nil {
		t.Fatal(err)
	}
	killed := errors.New("killed")
	archive.SetCrash(a, func(p string) error {
		if p == "before-delete" {
			return killed
		}
		return nil
	})
	if _, err := a.ArchiveBefore(ctx, time.Now().Add(time.Minute), nil); !errors.Is(err, killed) {
		t.Fatal(err)
	}
	obj := onlyObject(t, dir)
	data, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(obj, data, 0o644); err != nil {
		t.Fatal(err)
	}
	err = archive.NewReader(b, "").Events(ctx, archive.Filter{All: true}, func(core.Event) error { return nil })
	if !errors.Is(err, archive.ErrCorrupt) {
		t.Fatalf("reading a corrupt object: %v, want ErrCorrupt", err)
	}
	archive.SetCrash(a, nil)
	res, err := a.ArchiveBefore(ctx, time.Now().Add(time.Minute), nil)
	if err != nil || res.Reused != 0 || res.Objects != 1 {
		t.Fatalf("rerun over a corrupt object: %+v, %v; want it written again", res, err)
	}
	if got := archived(t, b, ""); !slices.Equal(idsOf(got), ids) {
		t.Fatalf("archive holds %d events after the rewrite", len(got))
	}
}

func onlyObject(t *testing.T, dir string) string {
	t.Helper()
	var found []string
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && strings.HasSuffix(p, ".jsonl.gz") {
			found = append(found, p)
		}
		return err
	})
	if err != nil || len(found) != 1 {
		t.Fatalf("objects %v, %v: want one", found, err)
	}
	return found[0]
}

// TestOneArchiverAtATime: archivers of several processes share the work
// (the database lock lets one step run at a time) and never write an
// event twice.
func TestOneArchiverAtATime(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"postgres", "mysql"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			o := openOutbox(t, backend)
			ids := o.produce(t, 600)
			o.publishAll(t)
			b, _ := openBucket(t)
			cutoff := time.Now().Add(time.Minute)
			var wg sync.WaitGroup
			var mu sync.Mutex
			var locked int
			for i := 0; i < 4; i++ {
				// Each its own store and pool: four processes.
				ob, err := sqlxoutbox.NewDB(o.db, sqlxoutbox.Options{Dialect: o.d, Table: o.name})
				if err != nil {
					t.Fatal(err)
				}
				a, err := archive.New(ob, b, archive.Options{BatchSize: 20})
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						res, err := a.ArchiveBefore(ctx, cutoff, nil)
						if errors.Is(err, archive.ErrLocked) {
							mu.Lock()
							locked++
							mu.Unlock()
							time.Sleep(time.Millisecond)
							continue
						}
						if err != nil {
							t.Error(err)
						}
						if res.Events == 0 {
							return
						}
					}
				}()
			}
			wg.Wait()
			if got := archived(t, b, ""); !slices.Equal(idsOf(got), ids) {
				t.Fatalf("archive holds %d events, want the 600 in order", len(got))
			}
			if _, events := manifestTotal(t, b, ""); events != 600 {
				t.Fatalf("manifests count %d events: some were archived twice", events)
			}
			if locked == 0 {
				t.Fatalf("no archiver ever found the lock held: the test did not contend")
			}
		})
	}
}

// TestArchiverIsACleaner: core.Cleanup with an Archiver archives before it
// deletes, in bounded batches.
func TestArchiverIsACleaner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := openOutbox(t, "postgres")
	ids := o.produce(t, 90)
	o.publishAll(t)
	o.exec(t, "UPDATE "+o.table+" SET published_at = published_at - interval '2 days'")
	b, _ := openBucket(t)
	a, err := archive.New(o.ob, b, archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := core.Cleanup(ctx, a, core.CleanupOptions{Retention: 24 * time.Hour, BatchSize: 25})
	if err != nil || n != 90 {
		t.Fatalf("cleanup deleted %d, %v; want 90", n, err)
	}
	if got := archived(t, b, ""); !slices.Equal(idsOf(got), ids) {
		t.Fatalf("archive holds %d events", len(got))
	}
	if objects, _ := manifestTotal(t, b, ""); objects != 4 {
		t.Fatalf("%d objects, want 4 batches of at most 25", objects)
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	t.Parallel()
	o := openOutbox(t, "sqlite")
	b, _ := openBucket(t)
	for _, opts := range []archive.Options{{BatchSize: -1}, {BatchSize: archive.MaxBatchSize + 1}, {Retention: -time.Second}} {
		if _, err := archive.New(o.ob, b, opts); !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("New(%+v): %v, want ErrInvalidOptions", opts, err)
		}
	}
	if _, err := archive.New(nil, b, archive.Options{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("New without a source: %v", err)
	}
}

// TestPartitionedArchiveThenDrop: on a day-partitioned outbox the archiver
// empties the past days and the partition maintainer after it drops their
// partitions; a partition still holding a pending event stays.
func TestPartitionedArchiveThenDrop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	popts := dialect.PartitionOptions{Ahead: 2, Logger: quiet}
	fx := sqlfixture.Open(t, testenv.Env(t, "TXOUTBOX_PG_DSN"), sqlfixture.Options{SkipInbox: true, Partitioned: &popts})
	if _, err := dialect.EnsurePartitions(ctx, fx.DB, dialect.Postgres, dialect.PartitionOptions{Ahead: 4, Logger: quiet}, time.Now().AddDate(0, 0, -5)); err != nil {
		t.Fatal(err)
	}
	ob, err := sqlxoutbox.NewDB(fx.DB, sqlxoutbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o := &outbox{db: fx.DB, d: dialect.Postgres, table: fx.Dialect.Quote(fx.Table), name: fx.Table.String(), ob: ob}
	ids := o.produce(t, 60)
	o.publishAll(t)
	// 20 events on each of five, four and three days ago; one of the last
	// day's stays pending.
	for i, id := range ids {
		if err := sqlfixture.Backdate(ctx, fx.DB, fx.Dialect, o.name, id, time.Duration(5-i/20)*24*time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	o.exec(t, "UPDATE "+o.table+" SET published_at = NULL WHERE event_id = ?", ids[59])
	// exists reports whether the partition of the day so many days ago is there.
	exists := func(daysAgo int) bool {
		var ok bool
		name := o.name + "_p" + time.Now().UTC().AddDate(0, 0, -daysAgo).Format("20060102")
		if err := fx.DB.QueryRow("SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !exists(5) || !exists(4) || !exists(3) {
		t.Fatal("the past partitions were not made")
	}
	pm, err := dialect.NewPartitionMaintainer(fx.DB, dialect.Postgres, popts)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := openBucket(t)
	a, err := archive.New(ob, b, archive.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	n, err := core.Cleanup(ctx, a.Then(pm), core.CleanupOptions{Retention: 36 * time.Hour, BatchSize: 25, Logger: quiet})
	if err != nil || n != 59 {
		t.Fatalf("cleanup: %d, %v; want the 59 published events archived", n, err)
	}
	if got := archived(t, b, ""); !slices.Equal(idsOf(got), ids[:59]) {
		t.Fatalf("archive holds %d events", len(got))
	}
	if exists(5) || exists(4) || !exists(3) {
		t.Fatalf("partitions of 5, 4, 3 days ago exist: %v %v %v; want the two emptied ones dropped, the one with a pending event kept",
			exists(5), exists(4), exists(3))
	}
	if left := o.count(t, "1=1"); left != 1 {
		t.Fatalf("%d rows left, want the pending one", left)
	}
}
