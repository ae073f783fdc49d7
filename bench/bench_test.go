package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/tier"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestQuickRun runs the whole command in -quick mode on the real
// PostgreSQL and checks that the table has a row for every scenario. It
// asserts nothing about the figures: they belong to the machine, not to the
// code.
func TestQuickRun(t *testing.T) {
	tier.SkipShort(t)
	c := defaults(true)
	c.DSN = testenv.Env(t, "TXOUTBOX_PG_DSN")
	c.MySQLDSN = testenv.Env(t, "TXOUTBOX_MYSQL_DSN")
	// Smaller still than -quick: the test proves the command works, and
	// the machine is shared with other tests.
	c.Backlog, c.Retained, c.Pending, c.ClaimSamples = 500, 1_000, 100, 5
	c.WatermillCurve = []int{200}
	c.MySQLRetained, c.MySQLBacklog = 1_000, 500
	c.LatencyFor, c.ProducerFor = 200*time.Millisecond, 200*time.Millisecond
	var out bytes.Buffer
	if err := run(context.Background(), c, &out, quietLog); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	lines := strings.Split(out.String(), "\n")
	if lines[0] != "| scenario | txoutbox | baseline | ratio | target | pass/fail |" {
		t.Fatalf("no table header: %q", lines[0])
	}
	// One prefix per row, in the order the table prints them.
	wantRows := []string{
		"| a  relay drain vs raw SQL", "| a' relay drain with SyncMark", "| a'' relay drain vs the textbook",
		"| a''' relay drain with DeleteOnPublish vs the relay", "| a''' relay drain with DeleteOnPublish vs lock, then DELETE", "| a''' delete on publish, by hand: claim and DELETE", "| a''' delete on publish, by hand: lock, then DELETE",
		"| b  relay drain (batch 500, 2 workers) vs Watermill", "| b  the same at a 200 backlog", "| b' the same vs Watermill with SubscribeBatchSize 1",
		"| c  latency p50 at 1000/s, in-process", "| c  latency p99 at 1000/s, in-process",
		"| c  latency p50 at 1000/s, LISTEN/NOTIFY", "| c  latency p99 at 1000/s, LISTEN/NOTIFY",
		"| c' latency p99 at 1000/s, in-process wake vs the floor", "| c  relay claims per event at 1000/s",
		"| c' latency p50 at 1000/s, in-process wake, vs the least its claim rate allows",
		"| c'' latency p50 at 1000/s, in-process wake, MaxCooldown 2ms", "| c'' latency p99 at 1000/s, in-process wake, MaxCooldown 2ms",
		"| c'' relay claims per event at 1000/s, in-process wake, MaxCooldown 2ms",
		"| d' producer tx/s with Enqueue vs a hand-written INSERT", "| d' producer tx/s with Enqueue, Options.SkipReadBack, vs a hand-written INSERT of the same event row (",
		"| d' producer tx/s with Enqueue vs the same INSERT by hand with Enqueue's write-back",
		"| d' producer tx/s, the hand-written INSERT with the write-back vs without (",
		"| d  producer tx/s with the outbox row (ExecWithEvents) vs without, 16 clients",
		"| d' producer tx/s with Enqueue vs a hand-written INSERT of the same event row, 16 clients",
		"| d' producer tx/s with Enqueue, Options.SkipReadBack, vs a hand-written INSERT of the same event row, 16 clients",
		"| d' producer tx/s with Enqueue vs the same INSERT by hand with its write-back, 16 clients",
		"| d' producer tx/s, the hand-written INSERT with the write-back vs without, 16 clients",
		"| d  producer tx/s with the outbox row (ExecWithEvents", "| d' producer tx/s with the outbox row (Enqueue",
		"| d  producer tx/s with a relay draining beside, in-process",
		"| d  producer tx/s with a relay draining beside, debounced NOTIFY", "| d' producer tx/s with pg_notify",
		"| d' producer tx/s, producers and a relay on one *sql.DB keeping database/sql's default 2 idle",
		"| e  claim latency p50", "| e  claim latency p99",
		"| f  producer tx/s, Enqueue in a pgx.Tx", "| f' producer tx/s, ExecWithEvents in a pgx.Tx", "| f  relay drain on the pgxpool store",
		"| l  log-mode drain vs table mode", "| l  log-mode drain vs Watermill", "| l' log-mode drain vs reading the slot alone",
		"| l' the same, streaming only", "| l' time to the first event", "| l' log-mode drain, position confirmed at once",
		"| l' log-mode drain into Kafka (kfake, in process), transactional",
		"| l  relay writes to the outbox table per event", "| l  log-mode latency p50", "| l  log-mode latency p99",
		"| l  producer tx/s in log mode (ExecWithEvents) vs without", "| l' producer tx/s in log mode vs table mode", "| l' producer tx/s in log mode with a log relay",
		"| r  drain of an equal 500 backlog, txoutbox (batch 500, 2 workers) vs River defaults", "| r  drain of an equal 500 backlog, txoutbox (batch 500, 2 workers) vs River tuned",
		"| r  latency p50 at 1000/s, just before COMMIT → publisher or worker, txoutbox in-process wake vs River defaults", "| r  latency p99 at 1000/s, txoutbox vs River defaults",
		"| r  latency p50 at 1000/s, just before COMMIT → publisher or worker, txoutbox in-process wake vs River tuned", "| r  latency p99 at 1000/s, txoutbox vs River tuned",
		"| r  producer tx/s, order row + txoutbox Enqueue vs order row + River InsertTx", "| r' producer tx/s, order row + River InsertTx vs the order row alone",
		"| r' producer tx/s, order row + txoutbox Enqueue vs the order row alone",
		"| v  console page: overview", "| v  console page: dead letters, grouped", "| v  console page: one dead-letter group",
		"| v  console page: events, newest", "| v  console page: events of one type", "| v  console page: events, dead",
		"| v  console page: event detail", "| v  console page: event by ID", "| v  console page: events of one aggregate",
		"| v  console page: ordered mode's held aggregates",
		"| v  console page: event by ID, with the lookup indexes", "| v  console page: events of one aggregate, with the lookup indexes",
		"| m  MariaDB relay drain", "| m''' MariaDB delete on publish, by hand", "| m''' MariaDB relay drain with DeleteOnPublish", "| m' MariaDB producer tx/s with the outbox row (Enqueue:",
		"| m' MariaDB producer tx/s with the outbox row (Enqueue with SkipReadBack", "| m' MariaDB producer tx/s with the outbox row (ExecWithEvents",
		"| m' MariaDB producer tx/s, a hand-written INSERT", "| m  MariaDB producer tx/s, Enqueue with SkipReadBack vs the hand-written",
		"| m  MariaDB claim latency p50", "| m  MariaDB claim latency p99",
		"| m  MariaDB table-mode drain, batch 2000 and 2 workers", "| m  MariaDB table-mode drain, batch 2000, 2 workers and DeleteOnPublish", "| m  MariaDB log-mode drain (binlog) vs table mode tuned", "| m' MariaDB log-mode drain vs reading the binlog alone", "| m' MariaDB log-mode drain, position stored every 20 ms",
		"| m  MariaDB table-mode latency p50", "| m  MariaDB table-mode latency p99, binlog wake-up", "| m' MariaDB producers' COMMIT p99 in the same run",
		"| m  MariaDB table-mode latency p50, binlog wake-up, Concurrency 2", "| m  MariaDB table-mode latency p99, binlog wake-up, Concurrency 2", "| m' MariaDB producers' COMMIT p99 in the Concurrency 2 run",
		"| m  MariaDB log-mode latency p50", "| m  MariaDB log-mode latency p99",
	}
	var got []string
	for _, l := range lines[2:] {
		if !strings.HasPrefix(l, "| ") {
			break
		}
		if n := strings.Count(l, " | "); n != 5 {
			t.Errorf("row with %d separators: %q", n, l)
		}
		if !strings.HasSuffix(l, " | pass |") && !strings.HasSuffix(l, " | FAIL |") && !strings.HasSuffix(l, " | info |") {
			t.Errorf("row without a verdict: %q", l)
		}
		got = append(got, l)
	}
	if len(got) != len(wantRows) {
		t.Errorf("%d rows, want %d", len(got), len(wantRows))
	}
	for i, want := range wantRows {
		if i < len(got) && !strings.HasPrefix(got[i], want) {
			t.Errorf("row %d is %q, want it to start with %q", i, got[i], want)
		}
	}
}

// benchEnv is a bench database with the drain table for the go test
// benchmarks of the hot paths.
func benchEnv(b *testing.B) *bench {
	c := defaults(true)
	c.DSN = testenv.Env(b, "TXOUTBOX_PG_DSN")
	be, err := newBench(context.Background(), c, quietLog)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.close() })
	if _, err := be.outbox(context.Background(), be.db, drainTable, sqlxoutbox.Options{}); err != nil {
		b.Fatal(err)
	}
	return be
}

// BenchmarkProcessBatch is one relay iteration on the sqlx store: claim
// 100 events, publish them to memory, mark them published, commit.
func BenchmarkProcessBatch(b *testing.B) {
	be := benchEnv(b)
	ctx := context.Background()
	box, err := be.outbox(ctx, be.db, drainTable, sqlxoutbox.Options{})
	if err != nil {
		b.Fatal(err)
	}
	relay, err := core.NewRelay(box, &memPublisher{}, core.RelayOptions{BatchSize: 100, Logger: quietLog})
	if err != nil {
		b.Fatal(err)
	}
	if err := be.fill(ctx, drainTable, 100*b.N); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		res, err := relay.ProcessBatch(ctx)
		if err != nil || res.Published != 100 {
			b.Fatalf("%+v %v", res, err)
		}
	}
	b.ReportMetric(float64(100*b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkRawClaimMark is the baseline of BenchmarkProcessBatch: the same
// claim and mark, written by hand on one pgx connection.
func BenchmarkRawClaimMark(b *testing.B) {
	be := benchEnv(b)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, be.dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := be.fill(ctx, drainTable, 100*b.N); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	n, err := rawDrain(ctx, conn, rawClaimAsync, b.N)
	if err != nil || n != 100*b.N {
		b.Fatalf("%d %v", n, err)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkEnqueue is the producer's cost of one event: BEGIN, Enqueue,
// COMMIT.
func BenchmarkEnqueue(b *testing.B) {
	be := benchEnv(b)
	ctx := context.Background()
	box, err := be.outbox(ctx, be.db, drainTable, sqlxoutbox.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		tx, err := be.db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := box.Enqueue(ctx, tx, core.Event{EventType: "order.created", AggregateID: "o-1", Payload: []byte(orderPayload(i))}); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

// The page of -markdown says how it was made and holds the run's table as
// the run printed it.
func TestMarkdownPage(t *testing.T) {
	t.Parallel()
	table := "| scenario | txoutbox | baseline | ratio | target | pass/fail |\n|---|---|---|---|---|---|\n| a  x | 1/s | 2/s | 50 % | — | info |\n\n2 cores; PostgreSQL 15; 2 rounds; took 1s\n"
	page := markdownPage([]string{"-quick", "-markdown", "docs/benchmarks.md"}, table)
	for _, want := range []string{"# Benchmark results\n", "`go run ./bench -quick -markdown docs/benchmarks.md`", "(performance.md)", strings.TrimSpace(table) + "\n"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q:\n%s", want, page)
		}
	}
}

// The README's comparison is taken from the run of docs/benchmarks.md, row
// by row: a figure of it is never copied by hand, and a run that renamed a
// row or left one out fails here.
func TestREADMEHeadlineIsTheBenchmarksRun(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := withHeadline(string(readme), string(page))
	if err != nil {
		t.Fatal(err)
	}
	if want != string(readme) {
		tbl, _ := headlineTable(string(page))
		t.Errorf("README.md's comparison is not the run of docs/benchmarks.md; `go run ./bench -markdown docs/benchmarks.md -readme README.md` writes both, and from the present page it reads:\n%s", tbl)
	}
	if len(headline) > 8 {
		t.Errorf("the README's comparison has %d rows, at most 8", len(headline))
	}
}
