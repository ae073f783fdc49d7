package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/twmb/franz-go/pkg/kfake"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/logmode"
	"github.com/txoutbox/txoutbox/logrelay"
)

const (
	logTable = "log_events"
	// logRawSlot is a second slot on the same log, read by rawSlotRate.
	logRawSlot   = "bench_raw"
	prodLog      = "log"       // ExecWithEvents into a table in log mode
	prodLogRelay = "log_relay" // the same, a log relay streaming beside
)

// logScenario runs scenario l, log mode (package logrelay): the drain of a
// backlog against table mode's recommended relay, Watermill's forwarder
// and the raw rate of reading the slot; end-to-end latency at a steady
// rate; the producers' cost; and the relay's writes per event.
func (b *bench) logScenario(ctx context.Context) ([]row, error) {
	if _, err := b.outbox(ctx, b.db, logTable, sqlxoutbox.Options{}); err != nil {
		return nil, err
	}
	// Slots are per server: names of this run's own. They keep the
	// database from being dropped, so each goes when the scenario ends.
	suffix := strings.TrimPrefix(b.name, "txoutbox_bench_")
	setup := func(n logrelay.Names) error {
		if err := logrelay.Setup(ctx, b.dsn, n); err != nil {
			return err
		}
		b.teardown = append(b.teardown, func() error {
			return logrelay.Teardown(context.Background(), b.dsn, n, logrelay.TeardownOptions{Force: true})
		})
		return nil
	}
	names := logrelay.Names{Table: logTable, Slot: "bench_log_" + suffix, Publication: "bench_log"}
	raw := logrelay.Names{Table: logTable, Slot: "bench_raw_" + suffix, Publication: "bench_log"}
	// A third slot on the same log, drained by a relay that confirms its
	// position only with the status it sends every second: what the
	// prompt confirmation (the default) costs the drain.
	lazy := logrelay.Names{Table: logTable, Slot: "bench_lazy_" + suffix, Publication: "bench_log"}
	// Two more, drained into Kafka (kfake, in this process): by the plain
	// publisher and by the transactional one, which publishes each batch
	// in a transaction with its position.
	kplain := logrelay.Names{Table: logTable, Slot: "bench_kplain_" + suffix, Publication: "bench_log"}
	ktx := logrelay.Names{Table: logTable, Slot: "bench_ktx_" + suffix, Publication: "bench_log"}
	for _, n := range []logrelay.Names{names, raw, lazy, kplain, ktx} {
		if err := setup(n); err != nil {
			return nil, err
		}
	}
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	if err != nil {
		return nil, err
	}
	defer kc.Close()
	kafkaDrain := func(names logrelay.Names, tx *kafkabroker.Transactional) (float64, error) {
		pub, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: kc.ListenAddrs(), Transactional: tx})
		if err != nil {
			return 0, err
		}
		defer pub.Close()
		d, err := b.logDrainTo(ctx, names, b.c.Backlog, false, 0, pub)
		return d.rate, err
	}
	var kafkaPlain, kafkaTx, vsPlain []float64

	// Drain: the same backlog for each, taking turns, round by round.
	var logRates, tableRates, rawRates, lazyRates, vsTable, vsRaw, vsLazy []float64
	// Streaming alone (first event to last, each side), and the time to
	// the first event.
	var logStream, rawStream, vsRawStream, logFirst, rawFirst []float64
	var writes int64
	for round := range b.c.Rounds {
		tr, err := b.relayDrainRate(ctx, "log_versus_table", b.c.Backlog)
		if err != nil {
			return nil, err
		}
		// Every slot starts the round where the fill starts: the walsender
		// decodes all the WAL a slot has not confirmed, the table-mode
		// drain's too, and a slot left further behind (the raw reader
		// confirms only at its end) would pay for more of it.
		if err := b.advanceSlots(ctx, names, lazy, raw, kplain, ktx); err != nil {
			return nil, err
		}
		if err := b.logFill(ctx, b.c.Backlog); err != nil {
			return nil, err
		}
		var lr, lz float64
		var ld logDrain
		for _, prompt := range []bool{round%2 == 0, round%2 != 0} {
			if prompt {
				if ld, err = b.logDrainRate(ctx, names, b.c.Backlog, round == 0, 0); err != nil {
					return nil, err
				}
				lr, writes = ld.rate, writes+ld.writes
				continue
			}
			lzd, err := b.logDrainRate(ctx, lazy, b.c.Backlog, false, time.Hour)
			if err != nil {
				return nil, err
			}
			lz = lzd.rate
		}
		rd, err := rawSlotRate(ctx, b.dsn, raw, b.c.Backlog)
		if err != nil {
			return nil, err
		}
		rr := rd.rate
		var kp, kt float64
		for _, tx := range []bool{round%2 == 0, round%2 != 0} {
			if !tx {
				if kp, err = kafkaDrain(kplain, nil); err != nil {
					return nil, fmt.Errorf("kafka drain: %w", err)
				}
				continue
			}
			if kt, err = kafkaDrain(ktx, &kafkabroker.Transactional{ID: "bench-" + suffix}); err != nil {
				return nil, fmt.Errorf("kafka drain, transactional: %w", err)
			}
		}
		kafkaPlain, kafkaTx, vsPlain = append(kafkaPlain, kp), append(kafkaTx, kt), append(vsPlain, kt/kp)
		logStream, rawStream, vsRawStream = append(logStream, ld.streaming), append(rawStream, rd.streaming), append(vsRawStream, ld.streaming/rd.streaming)
		logFirst, rawFirst = append(logFirst, ms(ld.first)), append(rawFirst, ms(rd.first))
		b.log.Info("log drain", "round", round, "log_per_s", int(lr), "lazy_confirm_per_s", int(lz), "table_per_s", int(tr), "raw_slot_per_s", int(rr))
		logRates, tableRates, rawRates, lazyRates = append(logRates, lr), append(tableRates, tr), append(rawRates, rr), append(lazyRates, lz)
		vsTable, vsRaw, vsLazy = append(vsTable, lr/tr), append(vsRaw, lr/rr), append(vsLazy, lr/lz)
	}
	wm := b.watermillBacklogRate
	if wm == 0 {
		var err error
		if wm, err = b.watermill(ctx, 0, b.c.Backlog, "log"); err != nil {
			return nil, err
		}
	}
	var rows0 []row
	backlog := count(b.c.Backlog)
	rows0 = append(rows0,
		row{name: fmt.Sprintf("l  log-mode drain vs table mode (batch %d, %d workers), equal %s backlog (events/s; median of rounds)", backlogBatchSize, backlogConcurrency, backlog),
			value: median(logRates), baseline: median(tableRates), ratios: vsTable, unit: "/s", ratioX: true,
			target: "≥ 3×", pass: median(vsTable) >= 3, verdict: true},
		row{name: fmt.Sprintf("l  log-mode drain vs Watermill SQL forwarder at its defaults, %s backlog", backlog),
			value: median(logRates), baseline: wm, unit: "/s", ratioX: true,
			target: "≥ 10×", pass: median(logRates) >= 10*wm, verdict: true},
		row{name: "l' log-mode drain vs reading the slot alone (walsender decoding and transfer, no JSON, no publish)",
			value: median(logRates), baseline: median(rawRates), ratios: vsRaw, unit: "/s", target: "—"},
		row{name: "l' the same, streaming only: first event to last on each side (the relay's connection, setup and first batch left out, as the reader's)",
			value: median(logStream), baseline: median(rawStream), ratios: vsRawStream, unit: "/s", target: "≥ 95 %", pass: median(vsRawStream) >= 0.95, verdict: true},
		row{name: "l' time to the first event: the relay (from Run) vs the slot reader (from START_REPLICATION, once connected)",
			value: median(logFirst), baseline: median(rawFirst), unit: "ms", ratioX: true, target: "—"},
		row{name: "l' log-mode drain, position confirmed at once (the default) vs only with the status sent every second (ConfirmInterval 1h)",
			value: median(logRates), baseline: median(lazyRates), ratios: vsLazy, unit: "/s", target: "—"},
		row{name: fmt.Sprintf("l' log-mode drain into Kafka (kfake, in process), transactional (exactly once) vs plain, equal %s backlog", backlog),
			value: median(kafkaTx), baseline: median(kafkaPlain), ratios: vsPlain, unit: "/s", target: "—"},
		row{name: "l  relay writes to the outbox table per event in log mode (rows written / events drained)",
			value: float64(writes) / float64(b.c.Backlog*b.c.Rounds), unit: "x", target: "0", pass: writes == 0, verdict: true},
	)

	lat, err := b.logLatency(ctx, names)
	if err != nil {
		return nil, fmt.Errorf("latency: %w", err)
	}
	rate := fmt.Sprintf("%d/s", b.c.LatencyRate)
	rows0 = append(rows0,
		row{name: "l  log-mode latency p50 at " + rate + " (commit → handed to the publisher)", value: ms(lat.p50), unit: "ms", target: "—"},
		row{name: "l  log-mode latency p99 at " + rate, value: ms(lat.p99), unit: "ms", target: "≤ 5 ms", pass: ms(lat.p99) <= 5, verdict: true},
	)

	// Producers: plain, table mode (ExecWithEvents) and log mode, taking
	// turns as in scenario d.
	if err := b.ensureOrders(ctx); err != nil {
		return nil, err
	}
	logProd := logrelay.Names{Table: producerTable + "_" + prodLog, Slot: "bench_prod_" + suffix, Publication: "bench_prod"}
	for _, v := range []string{prodPlain, prodOutbox, prodLog} {
		if _, err := b.outbox(ctx, b.db, producerTable+"_"+v, sqlxoutbox.Options{}); err != nil {
			return nil, err
		}
	}
	if err := setup(logProd); err != nil {
		return nil, err
	}
	prate, _, err := b.rotate(ctx, "log producers", []string{prodPlain, prodOutbox, prodLog, prodLogRelay}, func(v string, d time.Duration) (int64, time.Duration, error) {
		if v == prodLog || v == prodLogRelay {
			return b.logProducerRun(ctx, logProd, v == prodLogRelay, d)
		}
		return b.producerRun(ctx, v, d)
	})
	if err != nil {
		return nil, err
	}
	clients := fmt.Sprintf("%d clients", b.c.Producers)
	rows0 = append(rows0,
		row{name: "l  producer tx/s in log mode (ExecWithEvents) vs without outbox (" + clients + ")",
			value: prate[prodLog], baseline: prate[prodPlain], unit: " tx/s", target: "≥ 95 % (cost ≤ 5 %)", pass: prate[prodLog] >= 0.95*prate[prodPlain], verdict: true},
		row{name: "l' producer tx/s in log mode vs table mode (ExecWithEvents, no relay beside either)",
			value: prate[prodLog], baseline: prate[prodOutbox], unit: " tx/s", target: "—"},
		row{name: "l' producer tx/s in log mode with a log relay streaming beside vs without",
			value: prate[prodLogRelay], baseline: prate[prodLog], unit: " tx/s", target: "—"},
	)
	return rows0, nil
}

// logFill writes n events into the log-mode table as producers would, in
// transactions of logFillTx events (one transaction of the whole backlog
// would be decoded as one, spilled to disk by the walsender).
func (b *bench) logFill(ctx context.Context, n int) error {
	const logFillTx = 100
	for i := 0; i < n; i += logFillTx {
		if _, err := b.db.ExecContext(ctx, "INSERT INTO "+logTable+" (event_id, aggregate_type, aggregate_id, event_type, payload)"+
			" SELECT gen_random_uuid(), 'order', 'o-' || (g % 1000), 'order.created', "+payloadSQL("g")+
			" FROM generate_series($1::int, $2::int) AS g", i+1, min(i+logFillTx, n)); err != nil {
			return err
		}
	}
	return nil
}

// ensureOrders creates the producers' business table.
func (b *bench) ensureOrders(ctx context.Context) error {
	_, err := b.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id BIGSERIAL PRIMARY KEY, customer_id TEXT NOT NULL, amount_cents INT NOT NULL,
		payload JSONB NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())`)
	return err
}

// advanceSlots moves the (inactive) slots to the server's current WAL
// position, outside any measured time, restart position included: a
// walsender starts decoding at the slot's restart position, which the
// server moves only to a snapshot of running transactions it logged (every
// 15 s under load, and at a checkpoint). Without the CHECKPOINT, each
// drain would first decode again the WAL the table-mode drain just wrote
// (about 3.7 s here), which is the cost of a restart (docs/log-mode.md,
// limits), not of draining a backlog.
func (b *bench) advanceSlots(ctx context.Context, slots ...logrelay.Names) error {
	advance := func() error {
		for _, n := range slots {
			if _, err := b.db.ExecContext(ctx, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", n.Slot); err != nil {
				return fmt.Errorf("advance slot %s: %w", n.Slot, err)
			}
		}
		return nil
	}
	if err := advance(); err != nil {
		return err
	}
	if _, err := b.db.ExecContext(ctx, "CHECKPOINT"); err != nil {
		// Not superuser or pg_checkpoint: the drains then include the
		// restart's decoding.
		b.log.Warn("CHECKPOINT refused: scenario l's drains start at the slots' older restart position", "err", err)
	} else if err := advance(); err != nil {
		return err
	}
	if os.Getenv("BENCH_DEBUG") != "" {
		for _, n := range slots {
			b.log.Info("slot advanced", "slot", n.Slot, "restart_behind_confirmed_bytes", b.restartBehind(ctx, n.Slot))
		}
	}
	return nil
}

// restartBehind is how far a slot's restart position trails its confirmed
// one (bytes): the WAL a walsender started on it decodes again first; -1
// if it cannot be read.
func (b *bench) restartBehind(ctx context.Context, slot string) int64 {
	behind := int64(-1)
	_ = b.db.QueryRowContext(ctx, "SELECT pg_wal_lsn_diff(confirmed_flush_lsn, restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1",
		slot).Scan(&behind)
	return behind
}

// logDrain is one drain of a backlog from a slot: its rate from the start,
// its rate from the first event to the last, the time to the first event,
// and the rows written to the table.
type logDrain struct {
	rate, streaming float64
	first           time.Duration
	writes          int64
}

// logDrainRate runs a fresh log relay until it published n events from its
// slot, to an in-memory publisher. With BENCH_LOG_PROFILE set (a file
// name), the first drain is CPU-profiled.
func (b *bench) logDrainRate(ctx context.Context, names logrelay.Names, n int, first bool, confirmInterval time.Duration) (logDrain, error) {
	return b.logDrainTo(ctx, names, n, first, confirmInterval, nil)
}

// logDrainTo is logDrainRate to out (nil: an in-memory publisher, which
// alone measures the streaming rate and the first event's time).
func (b *bench) logDrainTo(ctx context.Context, names logrelay.Names, n int, first bool, confirmInterval time.Duration, out core.Publisher) (logDrain, error) {
	var d logDrain
	store, err := b.store(b.db, names.Table, sqlxoutbox.Options{})
	if err != nil {
		return d, err
	}
	pub := &memPublisher{}
	if out == nil {
		out = pub
	}
	r, err := logrelay.New(store, out, logrelay.Options{ConnString: b.dsn, Names: names, ConfirmInterval: confirmInterval, Options: logmode.Options{Relay: core.RelayOptions{BatchSize: backlogBatchSize, Logger: b.quiet}}})
	if err != nil {
		return d, err
	}
	if path := os.Getenv("BENCH_LOG_PROFILE"); path != "" && first {
		f, err := os.Create(path)
		if err != nil {
			return d, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return d, err
		}
		defer pprof.StopCPUProfile()
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- r.Run(rctx) }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for r.Counters().Published < int64(n) {
		select {
		case err := <-done:
			return d, fmt.Errorf("log relay stopped: %w", err)
		case <-ctx.Done():
			return d, ctx.Err()
		case <-tick.C:
		}
	}
	end := time.Now()
	el := end.Sub(start)
	d.rate = float64(n) / el.Seconds()
	if out == core.Publisher(pub) {
		firstAt, streaming := pub.streamed(end)
		d.streaming, d.first = streaming, firstAt.Sub(start)
	}
	// Let it confirm, so that the next round starts past this backlog.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		st, err := logrelay.Status(ctx, b.dsn, names)
		if err != nil {
			return d, err
		}
		if st.UnconfirmedBytes < 1<<20 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		return d, err
	}
	var rows int64
	if err := b.db.QueryRowContext(ctx, "SELECT count(*) FROM "+names.Table).Scan(&rows); err != nil {
		return d, err
	}
	d.writes = r.Counters().TableWrites + rows
	return d, nil
}

// rawSlotRate reads n of the outbox's messages from the slot with nothing
// but the replication protocol and pgoutput's framing: what the server's
// walsender and the connection give, before any JSON, batching or publish.
// It confirms what it read, so that the next round starts past it.
func rawSlotRate(ctx context.Context, dsn string, names logrelay.Names, n int) (logDrain, error) {
	var d logDrain
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return d, err
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return d, err
	}
	defer conn.Close(context.Background())
	start := time.Now()
	if err := pglogrepl.StartReplication(ctx, conn, names.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + names.Publication + "'", "messages 'true'"},
	}); err != nil {
		return d, err
	}
	var got int
	var firstAt time.Time
	var end pglogrepl.LSN // of the latest transaction read whole
	for got < n || end == 0 {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			return d, fmt.Errorf("after %d messages: %w", got, err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 || cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			return d, err
		}
		if len(xld.WALData) == 0 {
			continue
		}
		switch pglogrepl.MessageType(xld.WALData[0]) {
		case pglogrepl.MessageTypeMessage:
			if got == 0 {
				firstAt = time.Now()
			}
			got++
			end = 0
		case pglogrepl.MessageTypeCommit:
			var c pglogrepl.CommitMessage
			if err := c.Decode(xld.WALData[1:]); err != nil {
				return d, err
			}
			end = c.TransactionEndLSN
		}
	}
	finished := time.Now()
	el := finished.Sub(start)
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: end}); err != nil {
		return d, err
	}
	d.rate, d.streaming, d.first = float64(n)/el.Seconds(), float64(n-1)/finished.Sub(firstAt).Seconds(), firstAt.Sub(start)
	return d, nil
}

// logLatency runs producers at LatencyRate for LatencyFor, each event in a
// transaction of its own, while a log relay streams: latency runs from just
// before COMMIT to the relay's publish.
func (b *bench) logLatency(ctx context.Context, names logrelay.Names) (latencies, error) {
	box, err := b.store(b.db, names.Table, sqlxoutbox.Options{})
	if err != nil {
		return latencies{}, err
	}
	published := newPublishTimes()
	debug := os.Getenv("BENCH_DEBUG") != ""
	relayLog := b.quiet
	if debug {
		relayLog = b.log
	}
	r, err := logrelay.New(box, published, logrelay.Options{ConnString: b.dsn, Names: names, Options: logmode.Options{Relay: core.RelayOptions{Logger: relayLog}}})
	if err != nil {
		return latencies{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	// Steady state: the walsender has read past the WAL the scenarios
	// before wrote (it decodes all of it), and the relay confirmed it.
	for caughtUp := false; !caughtUp; {
		select {
		case err := <-done:
			return latencies{}, err
		case <-time.After(50 * time.Millisecond):
		}
		st, err := logrelay.Status(ctx, b.dsn, names)
		if err != nil {
			return latencies{}, err
		}
		caughtUp = r.Streaming() && st.UnconfirmedBytes < 64<<10
	}
	// Streaming may not be live yet: a walsender started on a slot first
	// decodes again everything from the slot's restart position, which
	// can trail its confirmed position by a drain's whole backlog, and
	// events committed meanwhile wait for it. The clock starts once a
	// probe event arrives within 20 ms of its commit.
	probes, firstProbe, err := b.probeLive(ctx, box, published)
	if err != nil {
		return latencies{}, err
	}
	var samples *walSamples
	if debug {
		b.log.Info("log latency: live", "probes", probes, "first_probe_latency", firstProbe,
			"restart_behind_confirmed_bytes", b.restartBehind(ctx, names.Slot))
		samples = sampleWAL(rctx, b.db, names.Slot, b.log)
	}
	ids, committed, commitTook, _, err := b.paced(ctx, func(ctx context.Context, i int) (string, time.Time, error) {
		return b.produceOne(ctx, box, i)
	})
	if err != nil {
		return latencies{}, err
	}
	total := len(ids)
	if err := published.wait(total+probes, 30*time.Second); err != nil {
		return latencies{}, err
	}
	cancel()
	<-done
	published.mu.Lock()
	defer published.mu.Unlock()
	if debug {
		var warm time.Duration
		for i := range total / 20 {
			warm = max(warm, published.at[ids[i]].Sub(committed[i]))
		}
		b.log.Info("log latency: the first events (left out)", "n", total/20, "first", published.at[ids[0]].Sub(committed[0]), "max", warm)
	}
	var lat []time.Duration
	var slow []window // from each slow event's COMMIT to its publish
	for i := total / 20; i < total; i++ {
		d := max(published.at[ids[i]].Sub(committed[i]), 0)
		lat = append(lat, d)
		if debug && d > 20*time.Millisecond {
			b.log.Info("slow log-mode event", "i", i, "at", committed[i].Sub(committed[0]), "clock", committed[i].Format("15:04:05.000"),
				"latency", d, "commit_took", commitTook[i])
			slow = append(slow, window{committed[i], committed[i].Add(d)})
		}
	}
	if samples != nil {
		samples.log(b.log, slow)
	}
	return latencies{p50: percentile(lat, 0.50), p99: percentile(lat, 0.99)}, nil
}

// probeLive commits one event at a time until one is published within
// 20 ms of its commit, at most a minute: the relay then streams what is
// committed now, not the WAL before it. It returns how many it committed
// and the first one's latency.
func (b *bench) probeLive(ctx context.Context, box *sqlxoutbox.Outbox, published *publishTimes) (n int, first time.Duration, err error) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		id, t0, err := b.produceOne(ctx, box, -1-n)
		if err != nil {
			return n, first, err
		}
		n++
		at, err := published.waitFor(id, time.Until(deadline))
		if err != nil {
			return n, first, err
		}
		d := at.Sub(t0)
		if n == 1 {
			first = d
		}
		if d < 20*time.Millisecond {
			return n, first, nil
		}
	}
	return n, first, fmt.Errorf("no probe event was published within 20 ms of its commit in a minute (%d tried, the first in %s)", n, first)
}

// logProducerRun is one slice of the log-mode producers: ExecWithEvents
// into a table in log mode, with a log relay streaming its slot beside if
// relay is set.
func (b *bench) logProducerRun(ctx context.Context, names logrelay.Names, relay bool, d time.Duration) (int64, time.Duration, error) {
	box, err := b.store(b.db, names.Table, sqlxoutbox.Options{})
	if err != nil {
		return 0, 0, err
	}
	if !relay {
		return b.produce(ctx, d, func(ctx context.Context, i int) error { return b.produceOrder(ctx, b.db, box, prodLog, i) })
	}
	r, err := logrelay.New(box, &memPublisher{}, logrelay.Options{ConnString: b.dsn, Names: names, Options: logmode.Options{Relay: core.RelayOptions{Logger: b.quiet}}})
	if err != nil {
		return 0, 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		cancel()
		<-done
	}()
	return b.produce(ctx, d, func(ctx context.Context, i int) error { return b.produceOrder(ctx, b.db, box, prodLog, i) })
}

// walSample is what the server said, at one moment of the latency run,
// about the WAL and whoever waits on it: evidence for a slow event.
type walSample struct {
	at time.Time
	// behind is how far the slot's walsender has sent, behind the WAL
	// written (bytes).
	behind int64
	// waits is every backend's wait that is not idleness, "type:event
	// (backend type)", with counts.
	waits string
}

type walSamples struct {
	mu   sync.Mutex
	list []walSample
}

// sampleWAL records a walSample every 50 ms until ctx ends (BENCH_DEBUG
// only).
func sampleWAL(ctx context.Context, db *sql.DB, slot string, log *slog.Logger) *walSamples {
	s := &walSamples{}
	go func() {
		failed := false
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var w walSample
			w.at = time.Now()
			err := db.QueryRowContext(ctx, `SELECT coalesce((SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), r.sent_lsn)::bigint
				FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1), -1),
				coalesce((SELECT string_agg(w, ', ') FROM (SELECT format('%s:%s (%s) x%s', wait_event_type, wait_event, backend_type, count(*)) AS w
					FROM pg_stat_activity WHERE wait_event_type IS NOT NULL AND wait_event_type NOT IN ('Activity', 'Client')
					AND pid <> pg_backend_pid() GROUP BY wait_event_type, wait_event, backend_type ORDER BY 1) q), '')`, slot).Scan(&w.behind, &w.waits)
			if err != nil {
				if ctx.Err() == nil && !failed {
					failed = true
					log.Warn("sampling the server failed", "err", err)
				}
				continue
			}
			s.mu.Lock()
			s.list = append(s.list, w)
			s.mu.Unlock()
		}
	}()
	return s
}

// window is a span of time, from and to.
type window struct{ from, to time.Time }

// log logs the samples taken within 200 ms of any of the windows of slow
// events.
func (s *walSamples) log(l *slog.Logger, windows []window) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.list {
		for _, win := range windows {
			if w.at.After(win.from.Add(-200*time.Millisecond)) && w.at.Before(win.to.Add(200*time.Millisecond)) {
				l.Info("server during slow events", "clock", w.at.Format("15:04:05.000"), "walsender_behind_bytes", w.behind, "waits", w.waits)
				break
			}
		}
	}
}
