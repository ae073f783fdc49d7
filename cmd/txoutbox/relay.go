package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/archive"
	"github.com/txoutbox/txoutbox/binlogrelay"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/mysqldsn"
	"github.com/txoutbox/txoutbox/logmode"
	"github.com/txoutbox/txoutbox/logrelay"
	"github.com/txoutbox/txoutbox/metrics"
	"github.com/txoutbox/txoutbox/ordered"
)

type relayFlags struct {
	syncMark        bool
	deleteOnPublish bool
	broker          string
	batchSize       int
	pollInterval    time.Duration
	concurrency     int
	maxAttempts     int
	initialBackoff  time.Duration
	maxBackoff      time.Duration
	shutdownTimeout time.Duration
	publishTimeout  time.Duration
	httpAddr        string
	lagThreshold    time.Duration
	statsInterval   time.Duration
	cleanupInterval time.Duration
	archiveTo       string
	retention       time.Duration
	drain           bool
	ordering        string
	deadLetter      string
	partitions      int
	partitioned     bool
	failFast        bool
	mode            string
	slot            string
	publication     string
	stream          string
	wake            string
	console         consoleFlags
	config          string
	maxConnections  int
}

func (a *app) relayCommand() *cobra.Command {
	var f relayFlags
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Publish committed events to a broker, with /metrics and /healthz",
		Long: `relay claims committed events in batches, publishes them to the broker and
marks them published, until it receives SIGINT or SIGTERM. It then finishes the
batch in flight (within --shutdown-timeout) and exits: an event is never lost,
and a batch is never marked twice. A batch cut off by the timeout is given back
unmarked and published again by the next relay.

Run it as its own process (a Deployment, a systemd unit). On PostgreSQL any
number of relays may run against one table: a claim locks its rows with
SELECT ... FOR UPDATE SKIP LOCKED, so no two relays publish the same event.
On SQLite run one.

Order: with --ordering on the events of one aggregate are published in the
order they were written, even across retries and several relays: aggregates
are hashed into --ordered-partitions partitions that the relays lease among
themselves, and an event waits while an earlier one of its aggregate is in
backoff (or dead, with --dead-letter-policy block). --ordering auto, the
default, turns it on for brokers that keep per-key order (kafka://, and sns://
with fifo_only=true). The default migrations create what it needs. --ordering
off has the highest throughput.

A failed event is retried with exponential backoff (--initial-backoff doubling
up to --max-backoff, with jitter) and dead-lettered after --max-attempts.

Log mode (--mode log): the relay streams events from PostgreSQL's logical
replication slot, or from MySQL's and MariaDB's binlog, instead of claiming
rows ('txoutbox log --help'; set it up with 'txoutbox migrate --mode log'). It
writes nothing per event and confirms its position (the slot's; the binlog
position stored in txoutbox_log_positions) once the broker took the events
before it. Failed events go to the table, where the same process retries them
as table mode does (--max-attempts, backoff, dead letters). Run several: one
streams, the others stand by and take over within a second or two of its loss.

Many outboxes (--config FILE): one process relays every outbox the YAML file
lists, each with its name, dsn (or dsn_env, an environment variable that
holds it), table, broker (or broker_env) and, optionally, batch_size,
concurrency, poll_interval, ordering and max_attempts; unset fields take this
command's flags. One outbox's database or broker being down holds up no
other, and SIGHUP reloads the file (new outboxes start, removed ones stop,
changed ones restart; a broken file is refused and logged). Outboxes on one
DSN share its connection pool. An outbox with mode: log is streamed as --mode
log does, from its slot and publication (PostgreSQL) or stream (MySQL), which
default to this command's flags; two log-mode outboxes of one database need
a slot (or stream) each. See the README.

A relay started while the database or the broker is down waits for them,
retrying with backoff (one log line when a dependency is down, one when it
answers), so that a supervisor does not crash-loop it; --fail-fast exits at
once instead. A missing outbox table does not heal: the relay stops at once
and names 'txoutbox migrate'.

The HTTP server on --http-addr (loopback by default: pass --http-addr
:9090 in a container, where the probes and Prometheus come from outside)
serves:
  /metrics   Prometheus metrics (txoutbox_* plus Go and process metrics)
  /healthz   readiness: 200 {"status":"ok"} while the database answers; 503
             while starting (waiting for a dependency), when the database
             does not answer, or while shutting down. Details go to the log.
  /livez     liveness: 200 while the process serves

` + brokerHelp + "\n\n" + keeperHelp,
		Example: `  # Try it out: print every event on stdout.
  txoutbox relay --dsn "$DATABASE_URL" --broker log://

  # Rehearse dead letters: every order.paid fails, dead after 3 attempts.
  txoutbox relay --broker 'log://?fail_types=order.paid' --max-attempts 3 --initial-backoff 100ms

  # RabbitMQ, four workers, metrics on all interfaces (a container), alerting
  # after 2 minutes of lag; the queue of consumer "billing" is declared, so
  # that no event is unroutable before billing first subscribes.
  TXOUTBOX_DSN=postgres://relay@db/app TXOUTBOX_BROKER='amqp://user:pass@rabbitmq:5672/?consumers=billing' \
    txoutbox relay --concurrency 4 --http-addr :9090 --lag-threshold 2m

  # Log mode: stream from the WAL (after 'txoutbox migrate --mode log').
  txoutbox relay --mode log --broker kafka://kafka-1:9092

  # Kafka; publish what is pending, then exit (a cron job, a test).
  txoutbox relay --broker kafka://kafka-1:9092,kafka-2:9092 --drain`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.runRelay(cmd.Context(), f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.broker, "broker", "", "broker URL: log://, memory://, amqp://, kafka://, sns:// (see above)")
	fl.IntVar(&f.batchSize, "batch-size", 100, fmt.Sprintf("events per claim (at most %d)", core.MaxBatchSize))
	fl.DurationVar(&f.pollInterval, "poll-interval", time.Second, "how long an idle worker waits before claiming again")
	fl.IntVar(&f.concurrency, "concurrency", 1, fmt.Sprintf("workers, each with its own claim (1 on SQLite; at most %d)", core.MaxConcurrency))
	fl.IntVar(&f.maxAttempts, "max-attempts", core.DefaultRetryPolicy.MaxAttempts, "attempts before an event is dead-lettered")
	fl.DurationVar(&f.initialBackoff, "initial-backoff", core.DefaultRetryPolicy.InitialBackoff, "wait after the first failure")
	fl.DurationVar(&f.maxBackoff, "max-backoff", core.DefaultRetryPolicy.MaxBackoff, "longest wait between attempts")
	fl.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long the batch in flight may take to finish after SIGTERM")
	fl.DurationVar(&f.publishTimeout, "publish-timeout", 30*time.Second, "how long publishing one batch may take; events not sent by then fail and are retried (0: no limit)")
	fl.StringVar(&f.httpAddr, "http-addr", "127.0.0.1:9090", `address of /metrics, /healthz and /livez (":9090" for all interfaces, e.g. in a container; "" disables)`)
	fl.DurationVar(&f.lagThreshold, "lag-threshold", time.Minute, "oldest pending age that counts as lagging (warning log, txoutbox_lagging=1)")
	fl.DurationVar(&f.statsInterval, "stats-interval", 15*time.Second, "how often the pending/dead gauges are refreshed")
	fl.DurationVar(&f.cleanupInterval, "cleanup-interval", 0, "run retention cleanup this often (0: never; see 'txoutbox cleanup')")
	fl.DurationVar(&f.retention, "retention", 30*24*time.Hour, "with --cleanup-interval: keep published events this long")
	fl.StringVar(&f.archiveTo, "archive-to", "", "with --cleanup-interval: archive expired events to this bucket (file://, s3://) before deleting them (see 'txoutbox archive')")
	fl.StringVar(&f.ordering, "ordering", "auto", "per-aggregate order: on, off, or auto (on when the broker keeps per-key order: kafka://, sns:// with fifo_only=true)")
	fl.StringVar(&f.deadLetter, "dead-letter-policy", "block", "ordered mode: block (hold an aggregate's later events behind a dead one) or skip")
	fl.IntVar(&f.partitions, "ordered-partitions", core.DefaultPartitionCount, "ordered mode: partitions aggregates are hashed into (the same for every relay of an outbox)")
	fl.BoolVar(&f.partitioned, "partitioned", false, "with --cleanup-interval: the table is partitioned by day (migrate --partitioned)")
	fl.BoolVar(&f.drain, "drain", false, "publish what is due, then exit instead of running until a signal")
	fl.BoolVar(&f.failFast, "fail-fast", false, "exit at once when the database or the broker does not answer at start, instead of waiting for them")
	f.console.register(cmd, "console-addr", "", `serve the operations console on this address too ("" none; see 'txoutbox console')`)
	fl.StringVar(&f.mode, "mode", "table", "table (claim events from the outbox table) or log (PostgreSQL: stream them from a logical replication slot; see 'txoutbox log --help')")
	fl.StringVar(&f.slot, "slot", logrelay.DefaultSlot, "with --mode log: the replication slot ('txoutbox log create' makes it)")
	fl.StringVar(&f.publication, "publication", logrelay.DefaultPublication, "with --mode log: the publication the slot is streamed with")
	fl.StringVar(&f.wake, "wake", "auto", "table mode: auto (on MySQL/MariaDB, wake from the binlog within milliseconds of a commit when it can be read; polling otherwise) or poll (--poll-interval only)")
	fl.StringVar(&f.stream, "stream", binlogrelay.DefaultName, "with --mode log on MySQL/MariaDB: the stream's name (its stored binlog position and its lock)")
	fl.StringVar(&f.config, "config", "", "relay every outbox listed in this YAML file in one process (see above); SIGHUP reloads it")
	fl.IntVar(&f.maxConnections, "max-connections", 0, "with --config: the connections the process may hold to all the outboxes' databases, shared among them (0: 16 per database)")
	fl.BoolVar(&f.deleteOnPublish, "delete-on-publish", false, "table mode: delete each event's row once the broker took it instead of marking it published (no history: nothing for stats' published count, the console, archive or replay)")
	fl.BoolVar(&f.syncMark, "sync-mark", false, "PostgreSQL: wait for the WAL flush of every mark (default: marks commit asynchronously; a mark lost in a database crash only re-publishes)")
	return cmd
}

// maxPartitions bounds --ordered-partitions: more partitions than relays
// could ever share only cost the leaser rows and the claims locks.
const maxPartitions = 4096

// checkRelayFlags refuses values that have no meaning, before anything
// connects.
func checkRelayFlags(f relayFlags) error {
	switch {
	case f.batchSize < 1 || f.batchSize > core.MaxBatchSize:
		return usagef("--batch-size %d: want 1 to %d", f.batchSize, core.MaxBatchSize)
	case f.concurrency < 1 || f.concurrency > core.MaxConcurrency:
		return usagef("--concurrency %d: want 1 to %d", f.concurrency, core.MaxConcurrency)
	case f.maxAttempts < 1:
		return usagef("--max-attempts %d: want at least 1", f.maxAttempts)
	case f.partitions < 1 || f.partitions > maxPartitions:
		return usagef("--ordered-partitions %d: want 1 to %d", f.partitions, maxPartitions)
	case f.initialBackoff <= 0 || f.maxBackoff <= 0:
		return usagef("--initial-backoff %s and --max-backoff %s: want positive durations", f.initialBackoff, f.maxBackoff)
	case f.pollInterval <= 0:
		return usagef("--poll-interval %s: want a positive duration", f.pollInterval)
	case f.shutdownTimeout < 0:
		return usagef("--shutdown-timeout %s: want 0 or more", f.shutdownTimeout)
	case f.publishTimeout < 0:
		return usagef("--publish-timeout %s: want 0 (no limit) or more", f.publishTimeout)
	case f.lagThreshold <= 0 || f.statsInterval <= 0:
		return usagef("--lag-threshold %s and --stats-interval %s: want positive durations", f.lagThreshold, f.statsInterval)
	case f.cleanupInterval < 0 || f.retention <= 0:
		return usagef("--cleanup-interval %s: want 0 (never) or more; --retention %s: want a positive duration", f.cleanupInterval, f.retention)
	case f.archiveTo != "" && f.deleteOnPublish:
		return usagef("--archive-to with --delete-on-publish: published events are deleted at once, there is nothing to archive")
	case f.archiveTo != "" && f.cleanupInterval == 0:
		return usagef("--archive-to needs --cleanup-interval")
	case f.mode != "table" && f.mode != "log":
		return usagef("--mode %q: want table or log", f.mode)
	case f.console.check("console-addr") != nil:
		return f.console.check("console-addr")
	case f.wake != "auto" && f.wake != "poll":
		return usagef("--wake %q: want auto or poll", f.wake)
	case f.mode == "log" && f.drain:
		return usagef("--drain has no meaning with --mode log: the stream has no end (drain the retry path with --mode table --drain)")
	}
	return nil
}

func (a *app) runRelay(ctx context.Context, f relayFlags) error {
	if err := checkRelayFlags(f); err != nil {
		return err
	}
	if f.maxConnections != 0 && (f.config == "" || f.maxConnections < 0) {
		return usagef("--max-connections %d: a positive cap with --config (a single relay sizes its pool by --concurrency)", f.maxConnections)
	}
	if f.config != "" {
		switch {
		case f.broker != "":
			return usagef("--config lists each outbox's broker: drop --broker (and %s)", envName("broker"))
		case f.mode != "table", f.drain, f.console.addr != "", f.cleanupInterval > 0:
			return usagef("--config sets each outbox's mode in the file (mode: log), and runs no --drain, --console-addr or --cleanup-interval (run those per outbox)")
		}
		return a.runGroup(ctx, f)
	}
	sealer, err := a.sealer(ctx)
	if err != nil {
		return err
	}
	ordering, ok := map[string]core.OrderingMode{"auto": core.OrderingAuto, "on": core.OrderingOn, "off": core.OrderingOff}[f.ordering]
	if !ok {
		return usagef("--ordering %q: want auto, on or off", f.ordering)
	}
	deadLetter, ok := map[string]core.DeadLetterPolicy{"block": core.DeadLetterBlock, "skip": core.DeadLetterSkip}[f.deadLetter]
	if !ok {
		return usagef("--dead-letter-policy %q: want block or skip", f.deadLetter)
	}
	if err := checkBrokerURL(f.broker); err != nil {
		return err
	}
	dsn, err := a.requireDSN()
	if err != nil {
		return err
	}
	db, err := openDatabaseLazily(dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if n := f.concurrency + 8; n > maxConns && db.dialect.MaxConcurrency() != 1 {
		// A worker per claim, and room for the others (see poolSizes).
		db.db.SetMaxOpenConns(n)
		db.db.SetMaxIdleConns(n)
	}
	ob, err := sqlxoutbox.NewDB(db.db, sqlxoutbox.Options{Dialect: db.dialect, Table: a.table, Logger: a.log, SyncMark: f.syncMark, DeleteOnPublish: f.deleteOnPublish})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}

	reg := prometheus.NewRegistry()
	// go_sql_*{db_name="outbox"}: go_sql_max_idle_closed_total growing is
	// a pool that opens a connection per transaction (see poolSizes).
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewDBStatsCollector(db.db, "outbox"))
	met, err := metrics.New(metrics.Options{Registerer: reg, LagThreshold: f.lagThreshold})
	if err != nil {
		return err
	}
	var h health
	h.set("starting")
	// /healthz turns 503 as soon as the signal arrives, while the batch in
	// flight finishes, so that no orchestrator counts on this instance.
	context.AfterFunc(ctx, func() { h.set("stopping") })
	if f.httpAddr != "" {
		srv, addr, err := a.serveHTTP(f.httpAddr, reg, db, &h)
		if err != nil {
			return err
		}
		a.log.Info("txoutbox: serving /metrics and /healthz", "addr", addr)
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}

	// Dependencies that are down at start are waited for, not a reason to
	// exit: under a supervisor that would be a crash loop.
	if err := a.awaitDependency(ctx, "database", db.redacted, f.failFast, func(ctx context.Context) error {
		return ob.Ping(ctx)
	}); err != nil {
		return err
	}
	txID := logTxID(f.mode, db.dialect, f.slot, f.stream)
	var pub publisher
	if err := a.awaitDependency(ctx, "broker", redact(f.broker), f.failFast, func(ctx context.Context) error {
		p, err := openBroker(ctx, f.broker, a.stdout, a.log, txID)
		pub = p
		return err
	}); err != nil {
		return err
	}
	defer func() {
		if err := pub.Close(); err != nil {
			a.log.Warn("txoutbox: close broker", "error", err)
		}
	}()

	// Sealed events are opened before the broker sees them when the keys
	// are given; without them they pass through sealed.
	var out core.Publisher = pub
	if sealer != nil {
		out = sealer.Publisher(pub)
	}
	var store core.Store = met.Store(ob)
	out = met.Publisher(out)
	tr, stopTracing, err := a.otlpTracing(ctx)
	if err != nil {
		return err
	}
	if tr != nil {
		store, out = tr.Store(store), tr.Publisher(out)
		defer func() {
			// Flush what the last batches traced, even after a signal.
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := stopTracing(sctx); err != nil {
				a.log.Warn("txoutbox: flush traces", "error", err)
			}
		}()
	}
	ropts := core.RelayOptions{
		BatchSize:       f.batchSize,
		PollInterval:    f.pollInterval,
		Concurrency:     f.concurrency,
		ShutdownTimeout: f.shutdownTimeout,
		PublishTimeout:  publishTimeout(f.publishTimeout),
		Retry:           core.RetryPolicy{MaxAttempts: f.maxAttempts, InitialBackoff: f.initialBackoff, MaxBackoff: f.maxBackoff},
		Logger:          a.log,
		Ordering:        ordering,
		Ordered:         core.OrderedOptions{DeadLetter: deadLetter, PartitionCount: f.partitions},
	}
	var (
		relay      *core.Relay
		stats      core.StatsReader = ob
		runner     relayRunner
		logStopped func(uptime time.Duration)
	)
	if f.mode == "log" {
		lr, err := newLogRelay(dsn, db.dialect, logrelayNames{table: a.table, slot: f.slot, publication: f.publication, stream: f.stream},
			store, out, ropts, reg, a.log)
		if err != nil {
			return err
		}
		relay, stats, runner, logStopped = lr.table, lr.stats, lr.runner, lr.stopped
	} else {
		relay, err = core.NewRelay(store, out, ropts)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUsage, err)
		}
		runner = relay
	}
	if l, ok := relay.Leaser().(*ordered.Leaser); ok {
		registerLeaserMetrics(reg, l)
	}
	registerHealthMetrics(reg, runner)
	mon, err := core.NewMonitor(stats, met.MonitorOptions(core.MonitorOptions{Interval: f.statsInterval, Logger: a.log}))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}

	if f.console.addr != "" {
		stopConsole, err := a.serveConsole(ctx, f.console, db, ob, f.lagThreshold)
		if err != nil {
			return err
		}
		defer stopConsole()
	}
	var bg sync.WaitGroup
	bgCtx, stopBG := context.WithCancel(ctx)
	defer func() {
		stopBG()
		bg.Wait()
	}()
	bg.Add(1)
	go func() {
		defer bg.Done()
		_ = mon.Run(bgCtx)
	}()
	if f.mode == "table" && f.wake == "auto" && db.dialect == dialect.MySQL && !f.drain {
		// Producers in other processes: their commits reach the binlog,
		// which wakes the relay (Run logs once and returns if it cannot
		// be read; the poll interval remains).
		driverDSN, err := mysqldsn.DriverDSN(dsn)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUsage, err)
		}
		w, err := binlogrelay.NewWatcher(driverDSN, relay, binlogrelay.WatcherOptions{Table: a.table, Logger: a.log})
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUsage, err)
		}
		bg.Add(1)
		go func() {
			defer bg.Done()
			_ = w.Run(bgCtx)
		}()
	}
	if f.cleanupInterval > 0 {
		var cleaner core.Cleaner = ob
		if f.partitioned {
			pm, err := dialect.NewPartitionMaintainer(db.db, db.dialect, dialect.PartitionOptions{Table: a.table, Logger: a.log})
			if err != nil {
				return fmt.Errorf("%w: %w", ErrUsage, err)
			}
			cleaner = pm
		}
		if f.archiveTo != "" {
			b, err := openBucket(ctx, "--archive-to", f.archiveTo)
			if err != nil {
				return err
			}
			defer b.Close()
			ar, err := archive.New(ob, b, archive.Options{LockName: "txoutbox_archive:" + a.table, Logger: a.log})
			if err != nil {
				return err
			}
			// A partitioned table: archive, then drop what it emptied.
			if f.partitioned {
				cleaner = ar.Then(cleaner)
			} else {
				cleaner = ar
			}
		}
		bg.Add(1)
		go func() {
			defer bg.Done()
			_ = core.RunCleanup(bgCtx, cleaner, core.CleanupOptions{Retention: f.retention, Interval: f.cleanupInterval, Logger: a.log})
		}()
	}

	opts := relay.Options()
	a.log.Info("txoutbox: relay started", "database", db.redacted, "table", a.table, "broker", redact(f.broker), "mode", f.mode,
		"batch_size", opts.BatchSize, "concurrency", opts.Concurrency, "max_attempts", opts.Retry.MaxAttempts, "ordered", relay.Ordered(), "drain", f.drain)
	if ctx.Err() == nil {
		h.set("ok")
	}
	start := time.Now()
	if f.drain {
		res, err := a.drain(ctx, relay, ob)
		h.set("stopping")
		a.log.Info("txoutbox: relay drained", "published", res.Published, "failed", res.Failed,
			"dead_lettered", res.DeadLettered, "took", time.Since(start).Round(time.Millisecond))
		if err != nil && ctx.Err() == nil {
			return err
		}
		// A last stats check so that the gauges (and the lagging warning)
		// describe what the drain left.
		if _, _, err := mon.Check(context.WithoutCancel(ctx)); err != nil {
			a.log.Warn("txoutbox: stats after drain", "error", err)
		}
		return nil
	}
	if err := runner.Run(ctx); err != nil {
		return err
	}
	h.set("stopping")
	if logStopped != nil {
		logStopped(time.Since(start).Round(time.Millisecond))
	}
	c := relay.Counters()
	a.log.Info("txoutbox: relay stopped", "batches", c.Batches, "published", c.Published, "failed", c.Failed,
		"dead_lettered", c.DeadLettered, "released", c.Released, "uptime", time.Since(start).Round(time.Millisecond))
	return nil
}

// awaitDependency calls try until it succeeds, with backoff, logging once
// when the dependency does not answer and once when it does. It returns at
// once, with the error, when failFast is set, when the error will not heal
// (a usage error, a missing table), or when ctx ends.
func (a *app) awaitDependency(ctx context.Context, what, name string, failFast bool, try func(context.Context) error) error {
	wait := 200 * time.Millisecond
	var down time.Time
	for {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := try(tctx)
		cancel()
		if err == nil {
			if !down.IsZero() {
				a.log.Info("txoutbox: "+what+" answers; starting", what, name, "waited", time.Since(down).Round(time.Millisecond))
			}
			return nil
		}
		if failFast || errors.Is(err, ErrUsage) || errors.Is(err, core.ErrNotMigrated) || errors.Is(err, core.ErrInvalidOptions) {
			return fmt.Errorf("%s %s: %w", what, name, err)
		}
		if ctx.Err() != nil {
			return nil // stopped while waiting: nothing was started
		}
		if down.IsZero() {
			down = time.Now()
			a.log.Warn("txoutbox: "+what+" does not answer; retrying with backoff until it does (--fail-fast exits instead)", what, name, "error", err)
		} else {
			a.log.Debug("txoutbox: "+what+" still does not answer", what, name, "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 15*time.Second)
	}
}

// drain publishes what is due with the relay's workers (core.Relay.Drain),
// then returns; on a terminal it shows the progress against the pending
// count it started with, elsewhere a line every few seconds.
func (a *app) drain(ctx context.Context, relay *core.Relay, ob *sqlxoutbox.Outbox) (core.RelayCounters, error) {
	var total int64 = -1
	if s, err := ob.Stats(ctx); err == nil {
		total = s.Pending
	}
	tty := isTerminal(a.stderr)
	start, last := time.Now(), time.Now()
	before := relay.Counters()
	report := func(published, failed int64, final bool) {
		rate := float64(published) / max(time.Since(start).Seconds(), 1e-3)
		of := ""
		if total >= 0 {
			of = fmt.Sprintf(" of %d pending at start", total)
		}
		line := fmt.Sprintf("published %d%s, %d failed (%.0f/s)", published, of, failed, rate)
		switch {
		case tty && final:
			fmt.Fprintf(a.stderr, "\r%s\n", line)
		case tty:
			fmt.Fprintf(a.stderr, "\r%s", line)
		case final || time.Since(last) >= 5*time.Second:
			a.log.Info("txoutbox: drain progress", "published", published, "pending_at_start", total, "failed", failed, "per_second", int(rate))
			last = time.Now()
		}
	}
	stop, reported := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(reported)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				c := relay.Counters()
				report(c.Published-before.Published, c.Failed-before.Failed, false)
			}
		}
	}()
	res, err := relay.Drain(ctx)
	close(stop)
	<-reported
	if tty || res.Claimed > 0 {
		report(int64(res.Published), int64(res.Failed), true)
	}
	return res, err
}

// publishTimeout maps the flag, where 0 means no limit, to
// RelayOptions.PublishTimeout, where 0 means the default and a negative
// value no limit.
func publishTimeout(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// relayRunner is what runs a relay of either mode: the table relay, or a
// log relay around its table relay.
type relayRunner interface {
	Run(context.Context) error
	Health() core.RelayHealth
}

// logTxID is the Kafka transactional ID of a relay in mode: in log mode
// it is named after what the relay streams, so that the relays of one
// slot (or stream) fence each other, and only them; "" in table mode,
// where transactions are refused.
func logTxID(mode string, d dialect.Dialect, slot, stream string) string {
	switch {
	case mode != "log":
		return ""
	case d == dialect.Postgres:
		return "txoutbox-" + slot
	}
	return "txoutbox-" + stream
}

// logrelayNames names a log-mode outbox: its table, and the slot and
// publication (PostgreSQL) or the stream (MySQL, MariaDB) it is read by.
type logrelayNames struct {
	table, slot, publication, stream string
}

// logRelay is a log-mode relay as the relay command runs it.
type logRelay struct {
	table  *core.Relay // its failure path
	stats  core.StatsReader
	runner relayRunner
	// stopped logs the stream's totals when it stops.
	stopped func(uptime time.Duration)
}

// newLogRelay builds the log relay of dsn's database, PostgreSQL's
// (logical replication) or MySQL's and MariaDB's (the binlog), and
// registers its metrics on reg.
func newLogRelay(dsn string, d dialect.Dialect, n logrelayNames, store core.Store, out core.Publisher, ropts core.RelayOptions,
	reg prometheus.Registerer, log *slog.Logger) (*logRelay, error) {
	stopped := func(counters func() logmode.Counters) func(time.Duration) {
		return func(uptime time.Duration) {
			c := counters()
			log.Info("txoutbox: log relay stopped", "published", c.Published, "failed", c.Failed, "held", c.Held,
				"table_writes", c.TableWrites, "stream_starts", c.Streams, "uptime", uptime)
		}
	}
	switch d {
	case dialect.Postgres:
		r, err := logrelay.New(store, out, logrelay.Options{
			ConnString: dsn,
			Names:      logrelay.Names{Table: n.table, Slot: n.slot, Publication: n.publication},
			Options:    logmode.Options{Relay: ropts},
		})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUsage, err)
		}
		registerLogMetrics(reg, r)
		return &logRelay{table: r.Table(), stats: r, runner: r, stopped: stopped(r.Counters)}, nil
	case dialect.MySQL:
		driverDSN, err := mysqldsn.DriverDSN(dsn)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUsage, err)
		}
		r, err := binlogrelay.New(store, out, binlogrelay.Options{
			DSN: driverDSN, Names: binlogrelay.Names{Table: n.table, Name: n.stream},
			Options: logmode.Options{Relay: ropts},
		})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUsage, err)
		}
		registerBinlogMetrics(reg, r)
		return &logRelay{table: r.Table(), stats: r, runner: r, stopped: stopped(r.Counters)}, nil
	}
	return nil, usagef("--mode log needs PostgreSQL (logical replication) or MySQL/MariaDB (the binlog); %s has neither", d.Name())
}
