package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"time"

	gmysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/binlogrelay"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/mysqldsn"
	"github.com/txoutbox/txoutbox/logmode"
)

// Tables of the MySQL log-mode and wake-up rows.
const (
	binlogTable = "binlog_events"
	wakeTable   = "wake_events"
)

// binlogRows are scenario m's rows of log mode (binlogrelay) and of the
// binlog wake-up: table mode's drain at its defaults and tuned, log mode's
// drain against them and against reading the binlog alone, and the
// latency across processes of both.
func (b *bench) binlogRows(ctx context.Context, m *mysqlBench) ([]row, error) {
	cfg, err := mysqldsn.Config(b.c.MySQLDSN)
	if err != nil {
		return nil, err
	}
	cfg.DBName = m.name
	dsn := cfg.FormatDSN()
	for _, table := range []string{binlogTable, wakeTable} {
		if err := dialect.Migrate(ctx, m.db, dialect.MySQL, dialect.MigrateOptions{Table: table, SkipInbox: true, Logger: b.quiet}); err != nil {
			return nil, err
		}
	}
	store, err := sqlxoutbox.NewDB(m.db, sqlxoutbox.Options{Dialect: dialect.MySQL, Table: mysqlDrainTable, Logger: b.quiet})
	if err != nil {
		return nil, err
	}
	deleting, err := sqlxoutbox.NewDB(m.db, sqlxoutbox.Options{Dialect: dialect.MySQL, Table: mysqlDrainTable, Logger: b.quiet, DeleteOnPublish: true})
	if err != nil {
		return nil, err
	}
	logStore, err := sqlxoutbox.NewDB(m.db, sqlxoutbox.Options{Dialect: dialect.MySQL, Table: binlogTable, Logger: b.quiet})
	if err != nil {
		return nil, err
	}
	n := b.c.MySQLBacklog
	var defRates, tunedRates, logRates, rawRates, lazyRates, tunedVsDef, logVsTuned, logVsRaw, logVsLazy []float64
	var delRates, delVsDef []float64
	for round := range b.c.Rounds {
		// Table mode, at its defaults, then tuned (mysqlTuned).
		def, err := b.mysqlDrainRate(ctx, m.db, store, n, core.RelayOptions{})
		if err != nil {
			return nil, err
		}
		tuned, err := b.mysqlDrainRate(ctx, m.db, store, n, mysqlTuned)
		if err != nil {
			return nil, err
		}
		// Tuned, and deleting on publish (sqlxoutbox.Options.DeleteOnPublish).
		del, err := b.mysqlDrainRate(ctx, m.db, deleting, n, mysqlTuned)
		if err != nil {
			return nil, err
		}
		delRates, delVsDef = append(delRates, del), append(delVsDef, del/def)
		// Log mode: a stream set up just before the backlog is written.
		// A second stream of the same backlog stores its position once
		// an hour (ConfirmInterval) instead of every 20 ms: what the
		// prompt position costs the drain.
		names := binlogrelay.Names{Table: binlogTable, Name: fmt.Sprintf("bench_%d", round)}
		lazy := binlogrelay.Names{Table: binlogTable, Name: fmt.Sprintf("bench_lazy_%d", round)}
		for _, nm := range []binlogrelay.Names{names, lazy} {
			if err := binlogrelay.Setup(ctx, dsn, nm); err != nil {
				return nil, err
			}
		}
		start, err := binlogStart(ctx, m.db, names)
		if err != nil {
			return nil, err
		}
		if err := mysqlInsertDue(ctx, m.db, logStore, n); err != nil {
			return nil, err
		}
		var lr, lz float64
		for _, prompt := range []bool{round%2 == 0, round%2 != 0} {
			if prompt {
				if lr, err = b.binlogDrainRate(ctx, logStore, dsn, names, n, 0); err != nil {
					return nil, err
				}
			} else if lz, err = b.binlogDrainRate(ctx, logStore, dsn, lazy, n, time.Hour); err != nil {
				return nil, err
			}
		}
		rr, err := rawBinlogRate(ctx, m.db, cfg.Addr, cfg.User, cfg.Passwd, m.name, start, n)
		if err != nil {
			return nil, err
		}
		b.log.Info("mysql log drain", "round", round, "table_default_per_s", int(def), "table_tuned_per_s", int(tuned), "log_per_s", int(lr), "lazy_position_per_s", int(lz), "raw_binlog_per_s", int(rr))
		defRates, tunedRates, logRates, rawRates, lazyRates = append(defRates, def), append(tunedRates, tuned), append(logRates, lr), append(rawRates, rr), append(lazyRates, lz)
		tunedVsDef, logVsTuned, logVsRaw, logVsLazy = append(tunedVsDef, tuned/def), append(logVsTuned, lr/tuned), append(logVsRaw, lr/rr), append(logVsLazy, lr/lz)
	}
	backlog := count(n)
	rows := []row{
		{name: fmt.Sprintf("m  MariaDB table-mode drain, batch %d and %d workers vs the defaults (batch 100, 1 worker), equal %s backlog", mysqlTuned.BatchSize, mysqlTuned.Concurrency, backlog),
			value: median(tunedRates), baseline: median(defRates), ratios: tunedVsDef, unit: "/s", ratioX: true, target: "—"},
		{name: fmt.Sprintf("m  MariaDB table-mode drain, batch %d, %d workers and DeleteOnPublish vs the defaults (batch 100, 1 worker, marks), same backlog", mysqlTuned.BatchSize, mysqlTuned.Concurrency),
			value: median(delRates), baseline: median(defRates), ratios: delVsDef, unit: "/s", ratioX: true, target: "≥ 3×", pass: median(delVsDef) >= 3, verdict: true},
		{name: "m  MariaDB log-mode drain (binlog) vs table mode tuned, same backlog", value: median(logRates), baseline: median(tunedRates), ratios: logVsTuned,
			unit: "/s", ratioX: true, target: "—"},
		{name: "m' MariaDB log-mode drain vs reading the binlog alone (the same replication client and decoding, no publish)", value: median(logRates), baseline: median(rawRates),
			ratios: logVsRaw, unit: "/s", target: "—"},
		{name: "m' MariaDB log-mode drain, position stored every 20 ms (the default) vs once an hour (ConfirmInterval 1h)", value: median(logRates), baseline: median(lazyRates),
			ratios: logVsLazy, unit: "/s", target: "—"},
	}

	// Latency across processes (as far as the relay knows: its own pool
	// and store, the producers another), table mode woken by the binlog,
	// then log mode.
	wakeStore, err := sqlxoutbox.NewDB(m.db, sqlxoutbox.Options{Dialect: dialect.MySQL, Table: wakeTable, Logger: b.quiet})
	if err != nil {
		return nil, err
	}
	// At the defaults, then with a second worker, which claims while the
	// first marks its batch and commits.
	wakeLatency := func(opts core.RelayOptions) (latencies, error) {
		opts.Logger = b.quiet
		return b.mysqlLatency(ctx, m.db, wakeStore, func(ctx context.Context, pub core.Publisher, relayDB *sql.DB) (func(), error) {
			relayStore, err := sqlxoutbox.NewDB(relayDB, sqlxoutbox.Options{Dialect: dialect.MySQL, Table: wakeTable, Logger: b.quiet})
			if err != nil {
				return nil, err
			}
			timed := &timedStore{Store: relayStore}
			relay, err := core.NewRelay(timed, pub, opts)
			if err != nil {
				return nil, err
			}
			w, err := binlogrelay.NewWatcher(dsn, relay, binlogrelay.WatcherOptions{Table: wakeTable, Logger: b.quiet})
			if err != nil {
				return nil, err
			}
			stop := runAll(ctx, relay.Run, w.Run)
			return func() {
				stop()
				// What the claims cost, for -v: the relay's side of the tail.
				b.log.Info("mysql binlog wake-up relay", append([]any{"concurrency", relay.Options().Concurrency, "wakes", w.Stats()}, timed.summary()...)...)
			}, nil
		})
	}
	wake, err := wakeLatency(core.RelayOptions{})
	if err != nil {
		return nil, fmt.Errorf("wake-up latency: %w", err)
	}
	wake2, err := wakeLatency(core.RelayOptions{Concurrency: 2})
	if err != nil {
		return nil, fmt.Errorf("wake-up latency, 2 workers: %w", err)
	}
	latNames := binlogrelay.Names{Table: binlogTable, Name: "bench_latency"}
	if err := binlogrelay.Setup(ctx, dsn, latNames); err != nil {
		return nil, err
	}
	logLat, err := b.mysqlLatency(ctx, m.db, logStore, func(ctx context.Context, pub core.Publisher, relayDB *sql.DB) (func(), error) {
		relayStore, err := sqlxoutbox.NewDB(relayDB, sqlxoutbox.Options{Dialect: dialect.MySQL, Table: binlogTable, Logger: b.quiet})
		if err != nil {
			return nil, err
		}
		r, err := binlogrelay.New(relayStore, pub, binlogrelay.Options{DSN: dsn, Names: latNames, Options: logmode.Options{Relay: core.RelayOptions{Logger: b.quiet}}})
		if err != nil {
			return nil, err
		}
		return runAll(ctx, r.Run), nil
	})
	if err != nil {
		return nil, fmt.Errorf("log-mode latency: %w", err)
	}
	rate := fmt.Sprintf("%d/s", b.c.LatencyRate)
	rows = append(rows,
		row{name: "m  MariaDB table-mode latency p50 at " + rate + ", relay woken by the binlog (commit → published; producers on another pool)", value: ms(wake.p50), unit: "ms", target: "—"},
		row{name: "m  MariaDB table-mode latency p99, binlog wake-up", value: ms(wake.p99), unit: "ms", target: "≤ 10 ms", pass: ms(wake.p99) <= 10, verdict: true},
		// The latencies run from just before COMMIT: the commit's own
		// time (its redo log and binlog flushes) is in each of them.
		row{name: "m' MariaDB producers' COMMIT p99 in the same run (inside every latency above, which starts before it)", value: ms(wake.commitP99), unit: "ms", target: "—"},
		row{name: "m  MariaDB table-mode latency p50, binlog wake-up, Concurrency 2", value: ms(wake2.p50), unit: "ms", target: "—"},
		row{name: "m  MariaDB table-mode latency p99, binlog wake-up, Concurrency 2", value: ms(wake2.p99), unit: "ms", target: "≤ 10 ms", pass: ms(wake2.p99) <= 10, verdict: true},
		row{name: "m' MariaDB producers' COMMIT p99 in the Concurrency 2 run", value: ms(wake2.commitP99), unit: "ms", target: "—"},
		row{name: "m  MariaDB log-mode latency p50 at " + rate + " (commit → published)", value: ms(logLat.p50), unit: "ms", target: "—"},
		row{name: "m  MariaDB log-mode latency p99", value: ms(logLat.p99), unit: "ms", target: "≤ 10 ms", pass: ms(logLat.p99) <= 10, verdict: true},
	)
	return rows, nil
}

// runAll runs fns until the returned stop is called, which waits for them.
func runAll(ctx context.Context, fns ...func(context.Context) error) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, len(fns))
	for _, f := range fns {
		go func() { _ = f(ctx); done <- struct{}{} }()
	}
	return func() {
		cancel()
		for range fns {
			<-done
		}
	}
}

// mysqlDrainRate writes n due events into store's table and returns the
// rate at which a relay with opts drains them.
func (b *bench) mysqlDrainRate(ctx context.Context, db *sql.DB, store *sqlxoutbox.Outbox, n int, opts core.RelayOptions) (float64, error) {
	if err := mysqlFill(ctx, db, store, n); err != nil {
		return 0, err
	}
	opts.Logger = b.quiet
	pub := &memPublisher{}
	relay, err := core.NewRelay(store, pub, opts)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if _, err := relay.Drain(ctx); err != nil {
		return 0, err
	}
	if got := pub.n.Load(); got != int64(n) {
		return 0, fmt.Errorf("drained %d events of %d", got, n)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// mysqlTuned is table mode's drain tuned for MariaDB: large batches, and
// two workers rather than more. Each claim walks the claim index from its
// start, over the entries of rows already claimed that InnoDB has not
// purged yet, and over the rows other workers hold (SKIP LOCKED): in a
// scratch drain of 50k rows, a 100-row claim took 1 ms on a fresh table and
// up to 7-11 ms between purges, and 8 workers of 250 drained slower than 1
// worker of 100. Fewer, larger claims pay that walk less often.
var mysqlTuned = core.RelayOptions{BatchSize: 2000, Concurrency: 2}

// binlogStart is the stream's stored position.
func binlogStart(ctx context.Context, db *sql.DB, names binlogrelay.Names) (binlogrelay.Position, error) {
	st, err := binlogrelay.ReadStatus(ctx, db, names)
	return st.Position, err
}

// binlogDrainRate runs a log relay on names until it published n events.
func (b *bench) binlogDrainRate(ctx context.Context, store *sqlxoutbox.Outbox, dsn string, names binlogrelay.Names, n int, confirmInterval time.Duration) (float64, error) {
	pub := &memPublisher{}
	r, err := binlogrelay.New(store, pub, binlogrelay.Options{DSN: dsn, Names: names, ConfirmInterval: confirmInterval, Options: logmode.Options{Relay: core.RelayOptions{BatchSize: 500, Logger: b.quiet}}})
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- r.Run(rctx) }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for pub.n.Load() < int64(n) {
		select {
		case err := <-done:
			return 0, fmt.Errorf("log relay stopped: %w", err)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
	el := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		return 0, err
	}
	return float64(n) / el.Seconds(), nil
}

// rawBinlogRate reads n inserted rows of binlogTable from start with the
// replication client the stream uses, decoding the table's inserts only,
// and nothing else: no transaction bookkeeping, no publish, no position.
func rawBinlogRate(ctx context.Context, db *sql.DB, addr, user, pass, database string, start binlogrelay.Position, n int) (float64, error) {
	var v string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
		return 0, err
	}
	flavor := gmysql.MySQLFlavor
	if strings.Contains(strings.ToLower(v), "mariadb") {
		flavor = gmysql.MariaDBFlavor
	}
	host, port, ok := strings.Cut(addr, ":")
	if !ok {
		port = "3306"
	}
	var p uint16
	if _, err := fmt.Sscan(port, &p); err != nil {
		return 0, err
	}
	syncer := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID: uint32(time.Now().UnixNano()%1_000_000) + 2_000_000, Flavor: flavor, Host: host, Port: p, User: user, Password: pass,
		Logger: slog.New(slog.DiscardHandler), DisableRetrySync: true,
		RowsEventDecodeFunc: func(e *replication.RowsEvent, data []byte) error {
			pos, err := e.DecodeHeader(data)
			if err != nil {
				return err
			}
			if string(e.Table.Schema) != database || string(e.Table.Table) != binlogTable || e.Type() != replication.EnumRowsEventTypeInsert {
				return nil
			}
			return e.DecodeData(pos, data)
		},
	})
	defer syncer.Close()
	t0 := time.Now()
	s, err := syncer.StartSync(gmysql.Position{Name: start.File, Pos: start.Offset})
	if err != nil {
		return 0, err
	}
	got := 0
	for got < n {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		ev, err := s.GetEvent(rctx)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("after %d rows: %w", got, err)
		}
		if re, ok := ev.Event.(*replication.RowsEvent); ok {
			got += len(re.Rows)
		}
	}
	return float64(n) / time.Since(t0).Seconds(), nil
}

// mysqlLatency runs producers at LatencyRate for LatencyFor on db, each
// event in a transaction of its own, while the relay that start runs (on
// its own pool) publishes: latency runs from just before COMMIT to the
// publish.
func (b *bench) mysqlLatency(ctx context.Context, db *sql.DB, box *sqlxoutbox.Outbox,
	start func(ctx context.Context, pub core.Publisher, relayDB *sql.DB) (stop func(), err error)) (latencies, error) {
	cfg, err := mysqldsn.Config(b.c.MySQLDSN)
	if err != nil {
		return latencies{}, err
	}
	var name string
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name); err != nil {
		return latencies{}, err
	}
	cfg.DBName, cfg.InterpolateParams = name, true
	relayDB, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return latencies{}, err
	}
	defer relayDB.Close()
	published := newPublishTimes()
	stop, err := start(ctx, published, relayDB)
	if err != nil {
		return latencies{}, err
	}
	defer stop()
	time.Sleep(time.Second) // the relay streams or watches
	ids, committed, commitTook, _, err := b.paced(ctx, func(ctx context.Context, i int) (string, time.Time, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return "", time.Time{}, err
		}
		evs := []core.Event{{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%1000), EventType: "order.created", Payload: []byte(orderPayload(i))}}
		if err := box.Enqueue(ctx, tx, evs...); err != nil {
			_ = tx.Rollback()
			return "", time.Time{}, err
		}
		t0 := time.Now()
		if err := tx.Commit(); err != nil {
			return "", time.Time{}, err
		}
		return evs[0].ID, t0, nil
	})
	if err != nil {
		return latencies{}, err
	}
	if err := published.wait(len(ids), 30*time.Second); err != nil {
		return latencies{}, err
	}
	published.mu.Lock()
	defer published.mu.Unlock()
	var lat []time.Duration
	for i := len(ids) / 20; i < len(ids); i++ {
		lat = append(lat, max(published.at[ids[i]].Sub(committed[i]), 0))
	}
	took := commitTook[len(ids)/20:]
	return latencies{p50: percentile(lat, 0.50), p99: percentile(lat, 0.99),
		commitP50: percentile(took, 0.50), commitP99: percentile(took, 0.99)}, nil
}
