// Command bench measures txoutbox on PostgreSQL against baselines measured
// in the same run, and prints one table: scenario, txoutbox figure, baseline
// figure, ratio, target, pass/fail.
//
//	go run ./bench -dsn postgres://postgres@127.0.0.1:24432/postgres?sslmode=disable
//	go run ./bench -quick          # smaller sizes, about a minute
//	go run ./bench -markdown docs/benchmarks.md   # and write the table as a page
//	go run ./bench -markdown docs/benchmarks.md -readme README.md # and the README's comparison
//
// The DSN (default $TXOUTBOX_PG_DSN) must be allowed to CREATE DATABASE: the
// command makes a fresh database for its run and drops it at the end (-keep
// keeps it). The scenarios:
//
//	a  relay drain of a backlog (in-memory publisher, batch 100, one worker)
//	   against a hand-written pgx loop of the same claim and mark statements
//	b  the relay as docs/performance.md recommends for a backlog against
//	   Watermill's SQL forwarder (watermill-sql v4) at its defaults, each
//	   draining the same backlog in turn, round by round; and both at
//	   smaller backlogs, once, for the curve
//	c  end-to-end latency, commit to publish, at a steady 1k events/s: with
//	   the in-process wake-up and with LISTEN/NOTIFY, against polling
//	d  producer throughput: with the outbox row against without, and with
//	   a relay draining beside the producers against without
//	e  claim latency with millions of published rows retained against an
//	   empty table
//	f  the pgx adapter against the sqlx adapter: producer tx/s with Enqueue
//	   and ExecWithEvents in a pgx.Tx against a *sql.Tx, and relay drain on
//	   the pgxpool store against the sqlx store
//	l  log mode (package logrelay): the drain of the same backlog against
//	   table mode's recommended relay, Watermill's forwarder (scenario b's
//	   figure when b ran) and reading the slot alone; latency at a steady
//	   1k events/s; producer tx/s against no outbox; the relay's writes per
//	   event. BENCH_LOG_PROFILE=file CPU-profiles the first log-mode drain.
//	v  the operations console (package console): each page's time with
//	   Retained published events and a fiftieth as many dead ones
//	r  River (riverqueue/river, pgx driver), at its defaults and tuned as
//	   its own benchmark command is: drain of an equal backlog, latency at
//	   a steady 1k events/s, producer tx/s with InsertTx vs Enqueue vs
//	   the business row alone
//	m  MySQL/MariaDB (-mysql-dsn, default $TXOUTBOX_MYSQL_DSN): relay drain
//	   against the same claim and mark statements by hand, producer tx/s
//	   with the outbox row against without, and claim latency with a million
//	   published rows retained against an empty table
//
// With -v the command logs its progress to stderr; BENCH_DEBUG=1 also logs
// every event of scenario c slower than a quarter of the poll interval, and
// for scenario l's latency the relay's own log, the probes before the
// clock starts, every event slower than 20 ms with its COMMIT's time, and
// what the server's walsender and waiting backends did meanwhile.
//
// The throughput scenarios (a, d) interleave their sides in short turns on
// the same database, so that a noisy, shared machine weighs on all sides
// alike; each side's figure is its events (or transactions) over its own
// time, summed over -rounds repetitions.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"
)

// config holds the sizes of a run.
type config struct {
	DSN    string
	Keep   bool
	Only   string // scenario letters to run, "" = all
	Rounds int
	// MySQLDSN is the MySQL or MariaDB server of scenario m (a mysql://
	// URL or the driver's DSN, a user that may CREATE DATABASE).
	MySQLDSN string

	Backlog        int           // a, b: events drained per run, by every side
	WatermillMax   time.Duration // b: cap on the forwarder's run
	WatermillCurve []int         // b: further backlogs, one round each, for the curve
	LatencyRate    int           // c: events per second
	LatencyFor     time.Duration // c: per mode
	PollInterval   time.Duration // c: the relay's poll
	Cooldown       time.Duration // c, d: the relays' RelayOptions.Cooldown (0: its default)
	Producers      int           // d: concurrent producer connections
	ProducerFor    time.Duration // d: per run
	Retained       int           // e: published rows kept
	MySQLRetained  int           // m: published rows kept (doubled from 1000 up to at least this)
	MySQLBacklog   int           // m: events drained per run by table mode and log mode
	Pending        int           // e: due rows the claims find
	ClaimSamples   int           // e: claims timed per table
	ClaimBatchSize int
}

func defaults(quick bool) config {
	c := config{
		Rounds:         2,
		Backlog:        200_000,
		WatermillMax:   10 * time.Minute,
		WatermillCurve: []int{10_000, 100_000},
		LatencyRate:    1000,
		LatencyFor:     10 * time.Second,
		PollInterval:   100 * time.Millisecond,
		Producers:      4,
		ProducerFor:    8 * time.Second,
		Retained:       5_000_000,
		MySQLRetained:  1_000_000,
		MySQLBacklog:   50_000,
		Pending:        10_000,
		ClaimSamples:   400,
		ClaimBatchSize: 100,
	}
	if quick {
		c.Rounds = 1
		c.Backlog = 20_000
		c.WatermillCurve = []int{2_000}
		c.LatencyFor = 2 * time.Second
		c.ProducerFor = 2 * time.Second
		c.Retained = 200_000
		c.MySQLRetained = 100_000
		c.MySQLBacklog = 5_000
		c.Pending = 2_000
		c.ClaimSamples = 100
	}
	return c
}

func main() {
	quick := flag.Bool("quick", false, "smaller sizes (about a minute)")
	dsn := flag.String("dsn", os.Getenv("TXOUTBOX_PG_DSN"), "PostgreSQL DSN allowed to CREATE DATABASE (default $TXOUTBOX_PG_DSN)")
	keep := flag.Bool("keep", false, "keep the benchmark database")
	only := flag.String("only", "", "run only these scenarios, e.g. ac (default all of abcdeflrvm; m needs -mysql-dsn)")
	mysqlDSN := flag.String("mysql-dsn", os.Getenv("TXOUTBOX_MYSQL_DSN"), "m: MySQL/MariaDB server allowed to CREATE DATABASE (default $TXOUTBOX_MYSQL_DSN)")
	rounds := flag.Int("rounds", 0, "repetitions of each throughput measurement (default 2, 1 with -quick)")
	backlog := flag.Int("backlog", 0, "a: backlog size (default 200000)")
	retained := flag.Int("retained", 0, "e: published rows retained (default 5000000)")
	cooldown := flag.Duration("cooldown", 0, "c, d: the relays' Cooldown between claims (default the relay's, 1ms; negative: none)")
	verbose := flag.Bool("v", false, "progress on stderr")
	markdown := flag.String("markdown", "", "also write the table as a Markdown page to this file (docs/benchmarks.md)")
	readme := flag.String("readme", "", "also rewrite the comparison of this README (README.md) from the run's table; needs every scenario")
	flag.Parse()

	c := defaults(*quick)
	c.DSN, c.Keep, c.Only, c.Cooldown, c.MySQLDSN = *dsn, *keep, *only, *cooldown, *mysqlDSN
	if *rounds > 0 {
		c.Rounds = *rounds
	}
	if *backlog > 0 {
		c.Backlog = *backlog
	}
	if *retained > 0 {
		c.Retained = *retained
	}
	if c.DSN == "" {
		fmt.Fprintln(os.Stderr, "bench: no DSN: pass -dsn or set TXOUTBOX_PG_DSN")
		os.Exit(2)
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var table bytes.Buffer
	if err := run(ctx, c, io.MultiWriter(os.Stdout, &table), log); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if *markdown != "" {
		if err := os.WriteFile(*markdown, []byte(markdownPage(os.Args[1:], table.String())), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
	if *readme != "" {
		if err := writeHeadline(*readme, table.String()); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
}

// markdownPage is the page -markdown writes: the table of this run and the
// line that says where it ran, under a header that says how to make it
// again, so that no figure of it is ever copied by hand.
func markdownPage(args []string, table string) string {
	var b strings.Builder
	b.WriteString("# Benchmark results\n\n")
	b.WriteString("The table of one run of the benchmark command, written by the command\n")
	fmt.Fprintf(&b, "itself (`go run ./bench %s`); run it again to refresh this page. Every\n", strings.Join(args, " "))
	b.WriteString("ratio compares figures measured in the same run; the method and what\n")
	b.WriteString("each scenario measures are in [performance.md](performance.md).\n\n")
	b.WriteString(strings.TrimSpace(table))
	b.WriteString("\n")
	return b.String()
}

// run makes the database, runs the scenarios and prints the table to out.
func run(ctx context.Context, c config, out io.Writer, log *slog.Logger) (err error) {
	start := time.Now()
	b, err := newBench(ctx, c, log)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := b.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	want := func(s string) bool { return c.Only == "" || strings.Contains(c.Only, s) }
	var rows []row
	if want("a") {
		drain, err := b.drain(ctx)
		if err != nil {
			return fmt.Errorf("scenario a: %w", err)
		}
		rows = append(rows, drain.rows()...)
	}
	if want("b") {
		r, err := b.versusWatermill(ctx)
		if err != nil {
			return fmt.Errorf("scenario b: %w", err)
		}
		rows = append(rows, r...)
	}
	if want("c") {
		r, err := b.latency(ctx)
		if err != nil {
			return fmt.Errorf("scenario c: %w", err)
		}
		rows = append(rows, r...)
	}
	if want("d") {
		r, err := b.producers(ctx)
		if err != nil {
			return fmt.Errorf("scenario d: %w", err)
		}
		rows = append(rows, r...)
	}
	if want("e") {
		r, err := b.bloat(ctx)
		if err != nil {
			return fmt.Errorf("scenario e: %w", err)
		}
		rows = append(rows, r...)
	}
	if want("f") {
		r, err := b.pgxScenario(ctx)
		if err != nil {
			return fmt.Errorf("scenario f: %w", err)
		}
		rows = append(rows, r...)
	}
	if want("l") {
		r, err := b.logScenario(ctx)
		if err != nil {
			return fmt.Errorf("scenario l: %w", err)
		}
		rows = append(rows, r...)
	}
	if want("r") {
		r, err := b.riverScenario(ctx)
		if err != nil {
			return fmt.Errorf("scenario r: %w", err)
		}
		rows = append(rows, r...)
	}
	if want("v") {
		r, err := b.consoleScenario(ctx)
		if err != nil {
			return fmt.Errorf("scenario v: %w", err)
		}
		rows = append(rows, r...)
	}
	if want("m") {
		if c.MySQLDSN == "" {
			if c.Only != "" {
				return fmt.Errorf("scenario m: no MySQL server: pass -mysql-dsn or set TXOUTBOX_MYSQL_DSN")
			}
			log.Warn("scenario m skipped: no MySQL server (pass -mysql-dsn or set TXOUTBOX_MYSQL_DSN)")
		} else {
			r, err := b.mysqlScenario(ctx)
			if err != nil {
				return fmt.Errorf("scenario m: %w", err)
			}
			rows = append(rows, r...)
		}
	}
	printTable(out, rows)
	server := "PostgreSQL " + b.server
	if b.mysqlServer != "" {
		server += "; MySQL server " + b.mysqlServer
	}
	fmt.Fprintf(out, "\n%s; %s; %d rounds; took %s\n", b.machine, server, c.Rounds, time.Since(start).Round(time.Second))
	return nil
}

// row is one line of the table.
type row struct {
	name            string
	value, baseline float64
	// ratios, when set, are the per-round ratios: the ratio column shows
	// their median with the spread, and value and baseline are the
	// medians of the two sides.
	ratios        []float64
	unit          string // "/s", "ms", "tx/s"
	ratioX        bool   // show the ratio as N× rather than a percentage
	target        string
	pass, verdict bool // verdict false: informational row
}

func (r row) format(v float64) string {
	switch r.unit {
	case "ms":
		return fmt.Sprintf("%.2f ms", v)
	case "x":
		return fmt.Sprintf("%.2f", v)
	case "":
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.0f%s", v, r.unit)
}

func (r row) ratio() string {
	if len(r.ratios) > 0 {
		rs := slices.Clone(r.ratios)
		slices.Sort(rs)
		med := median(rs)
		if r.ratioX {
			return fmt.Sprintf("%.1f× (%.1f-%.1f)", med, rs[0], rs[len(rs)-1])
		}
		return fmt.Sprintf("%.0f %% (%.0f-%.0f)", 100*med, 100*rs[0], 100*rs[len(rs)-1])
	}
	if r.baseline == 0 {
		return "—"
	}
	q := r.value / r.baseline
	if r.ratioX {
		return fmt.Sprintf("%.1f×", q)
	}
	return fmt.Sprintf("%.0f %%", 100*q)
}

func printTable(w io.Writer, rows []row) {
	fmt.Fprintln(w, "| scenario | txoutbox | baseline | ratio | target | pass/fail |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, r := range rows {
		verdict := "info"
		if r.verdict {
			verdict = "FAIL"
			if r.pass {
				verdict = "pass"
			}
		}
		base := "—" // a row measured alone
		if r.baseline != 0 || len(r.ratios) > 0 {
			base = r.format(r.baseline)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", r.name, r.format(r.value), base, r.ratio(), r.target, verdict)
	}
}

// median returns the median of xs (0 for none), leaving xs as it is.
func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	switch n := len(xs); {
	case n == 0:
		return 0
	case n%2 == 1:
		return xs[n/2]
	default:
		return (xs[n/2-1] + xs[n/2]) / 2
	}
}
