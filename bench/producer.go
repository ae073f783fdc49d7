package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/pgnotify"
)

const producerTable = "producer_events"

// Variants of scenario d's producer transaction and what runs beside it.
const (
	prodPlain       = "plain"        // INSERT order; COMMIT
	prodOutbox      = "outbox"       // INSERT order with its event in one statement (ExecWithEvents); COMMIT
	prodEnqueue     = "enqueue"      // INSERT order; Enqueue; COMMIT
	prodRelay       = "relay"        // outbox, relay draining beside, woken in-process
	prodRelayNotify = "relay_notify" // outbox, relay draining beside, woken by the debounced NOTIFY
	// prodRelay on a pool that keeps database/sql's default two idle
	// connections (the pool trap; prodRelay's keeps as many as open).
	prodRelayIdle2  = "relay_idle2"
	prodNotifyPerTx = "notify_per_tx"
	prodHand        = "hand" // INSERT order; a hand-written INSERT of the same event row (no write-back); COMMIT
	// INSERT order; the statement Enqueue sends, by hand, its RETURNING
	// read through database/sql as Enqueue reads it; COMMIT
	prodHandReturning = "hand_returning"
	prodEnqueueSkip   = "enqueue_skip_read_back" // INSERT order; Enqueue with SkipReadBack; COMMIT
)

// producers runs scenario d: transactions per second of Producers
// connections inserting an order, with and without the outbox row, and
// with and without a relay draining the outbox beside them.
//
// The variants take turns in slices of a second, in a rotating order, until
// each has run ProducerFor per round: the checkpoints, autovacuum and
// neighbours of a shared machine then fall on all of them alike, where runs
// of several seconds one after the other measured the machine's moods as
// much as the variants. Each variant writes its events to a table of its
// own, so that a relay drains only what its own producers wrote.
func (b *bench) producers(ctx context.Context) ([]row, error) {
	if err := b.ensureOrders(ctx); err != nil {
		return nil, err
	}
	variants := []string{prodPlain, prodOutbox, prodEnqueue, prodEnqueueSkip, prodHand, prodHandReturning, prodRelay, prodRelayNotify, prodNotifyPerTx, prodRelayIdle2}
	tables := "orders"
	for _, v := range variants {
		if _, err := b.outbox(ctx, b.db, producerTable+"_"+v, sqlxoutbox.Options{}); err != nil {
			return nil, err
		}
		tables += ", " + producerTable + "_" + v
	}
	if _, err := b.db.ExecContext(ctx, "TRUNCATE "+tables); err != nil {
		return nil, err
	}
	if _, err := b.db.ExecContext(ctx, "VACUUM ANALYZE "+tables); err != nil {
		return nil, err
	}
	_, rate, err := b.rotate(ctx, "producers", variants, func(v string, d time.Duration) (int64, time.Duration, error) {
		return b.producerRun(ctx, v, d)
	})
	if err != nil {
		return nil, err
	}
	// Commit batching changes the picture with many clients: the four
	// variants that compare the outbox row with its baselines, again with
	// 16 clients.
	few := b.c.Producers
	b.c.Producers = 16
	_, rate16, err := b.rotate(ctx, "producers (16 clients)", []string{prodPlain, prodOutbox, prodEnqueue, prodEnqueueSkip, prodHand, prodHandReturning}, func(v string, d time.Duration) (int64, time.Duration, error) {
		return b.producerRun(ctx, v, d)
	})
	b.c.Producers = few
	if err != nil {
		return nil, err
	}
	clients := fmt.Sprintf("%d clients", b.c.Producers)
	return []row{
		rate.row("d' producer tx/s with Enqueue vs a hand-written INSERT of the same event row ("+clients+")", prodEnqueue, prodHand, "≥ 97 %", 0.97),
		rate.row("d' producer tx/s with Enqueue, Options.SkipReadBack, vs a hand-written INSERT of the same event row ("+clients+")", prodEnqueueSkip, prodHand, "≥ 97 %", 0.97),
		rate.row("d' producer tx/s with Enqueue vs the same INSERT by hand with Enqueue's write-back (RETURNING id, created_at read through database/sql; "+clients+")", prodEnqueue, prodHandReturning, "—", 0),
		rate.row("d' producer tx/s, the hand-written INSERT with the write-back vs without ("+clients+")", prodHandReturning, prodHand, "—", 0),
		rate16.row("d  producer tx/s with the outbox row (ExecWithEvents) vs without, 16 clients", prodOutbox, prodPlain, "≥ 85 %", 0.85),
		rate16.row("d' producer tx/s with Enqueue vs a hand-written INSERT of the same event row, 16 clients", prodEnqueue, prodHand, "≥ 97 %", 0.97),
		rate16.row("d' producer tx/s with Enqueue, Options.SkipReadBack, vs a hand-written INSERT of the same event row, 16 clients", prodEnqueueSkip, prodHand, "≥ 97 %", 0.97),
		rate16.row("d' producer tx/s with Enqueue vs the same INSERT by hand with its write-back, 16 clients", prodEnqueue, prodHandReturning, "—", 0),
		rate16.row("d' producer tx/s, the hand-written INSERT with the write-back vs without, 16 clients", prodHandReturning, prodHand, "—", 0),
		rate.row("d  producer tx/s with the outbox row (ExecWithEvents: one statement) vs without ("+clients+")", prodOutbox, prodPlain, "≥ 85 %", 0.85),
		rate.row("d' producer tx/s with the outbox row (Enqueue: a statement of its own) vs without", prodEnqueue, prodPlain, "—", 0),
		rate.row("d  producer tx/s with a relay draining beside, in-process wake, vs no relay", prodRelay, prodOutbox, "≥ 75 % (cost ≤ 25 %)", 0.75),
		rate.row("d  producer tx/s with a relay draining beside, debounced NOTIFY, vs no relay", prodRelayNotify, prodOutbox, "≥ 75 % (cost ≤ 25 %)", 0.75),
		rate.row("d' producer tx/s with pg_notify inside every transaction vs without (why we debounce)", prodNotifyPerTx, prodOutbox, "—", 0),
		rate.row("d' producer tx/s, producers and a relay on one *sql.DB keeping database/sql's default 2 idle connections vs as many idle as open (the pool trap; "+clients+")", prodRelayIdle2, prodRelay, "—", 0),
	}, nil
}

// rotate runs the variants in turns of a second, in a rotating order, until
// each has run ProducerFor per round, and returns each one's transactions
// per second over its own time, overall and round by round.
func (b *bench) rotate(ctx context.Context, what string, variants []string, run func(v string, d time.Duration) (int64, time.Duration, error)) (map[string]float64, rounds, error) {
	slice := min(time.Second, b.c.ProducerFor)
	turns := max(int(b.c.ProducerFor/slice), 1)
	type total struct {
		n  int64
		el time.Duration
	}
	totals := map[string]*total{}
	for _, v := range variants {
		totals[v] = &total{}
	}
	perRound := rounds{}
	for round := range b.c.Rounds {
		inRound := map[string]*total{}
		for _, v := range variants {
			inRound[v] = &total{}
		}
		for k := range turns {
			for j := range variants {
				if err := ctx.Err(); err != nil {
					return nil, nil, err
				}
				v := variants[(k+j+round)%len(variants)]
				n, el, err := run(v, slice)
				if err != nil {
					return nil, nil, fmt.Errorf("%s: %w", v, err)
				}
				totals[v].n += n
				totals[v].el += el
				inRound[v].n += n
				inRound[v].el += el
			}
		}
		for _, v := range variants {
			perRound[v] = append(perRound[v], float64(inRound[v].n)/inRound[v].el.Seconds())
			b.log.Info(what, "round", round, "variant", v, "tx_per_s", int(perRound[v][round]), "tx_per_s_so_far", int(float64(totals[v].n)/totals[v].el.Seconds()))
		}
	}
	rate := map[string]float64{}
	for v, t := range totals {
		rate[v] = float64(t.n) / t.el.Seconds()
	}
	return rate, perRound, nil
}

// rounds are the transactions per second of each variant, one per round.
type rounds map[string][]float64

// row compares variant v with base round by round: the ratio column is the
// median of the per-round ratios with their spread, and the row passes when
// that median is at least least (a row without a target has least 0).
func (r rounds) row(name, v, base, target string, least float64) row {
	var ratios []float64
	for i := range min(len(r[v]), len(r[base])) {
		ratios = append(ratios, r[v][i]/r[base][i])
	}
	out := row{name: name, value: median(r[v]), baseline: median(r[base]), ratios: ratios, unit: " tx/s", target: target}
	if least > 0 {
		out.pass, out.verdict = median(ratios) >= least, true
	}
	return out
}

// produce runs tx on Producers goroutines for about d, the i-th call of
// each with i = goroutine, goroutine + Producers, ..., and returns the
// transactions committed and the time they took.
func (b *bench) produce(ctx context.Context, d time.Duration, tx func(ctx context.Context, i int) error) (int64, time.Duration, error) {
	var count atomic.Int64
	errs := make(chan error, b.c.Producers)
	var wg sync.WaitGroup
	stopAt := time.Now().Add(d)
	start := time.Now()
	for w := range b.c.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; time.Now().Before(stopAt); i += b.c.Producers {
				if err := tx(ctx, i); err != nil {
					errs <- err
					return
				}
				count.Add(1)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	select {
	case err := <-errs:
		return 0, 0, err
	default:
	}
	return count.Load(), el, nil
}

// producerRun runs one slice of a variant for about d and returns the
// transactions committed and the time they took.
func (b *bench) producerRun(ctx context.Context, variant string, d time.Duration) (int64, time.Duration, error) {
	table := producerTable + "_" + variant
	// Closed last, after the goroutines below stopped.
	var closeAfter []func() error
	defer func() {
		for _, c := range closeAfter {
			_ = c()
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var bg sync.WaitGroup
	defer bg.Wait()
	defer cancel()
	goRun := func(fn func(context.Context) error) {
		bg.Add(1)
		go func() {
			defer bg.Done()
			_ = fn(ctx)
		}()
	}

	// The producers' pool, and the in-process relay's.
	pool := b.db
	if variant == prodRelayIdle2 {
		var err error
		if pool, err = b.open(""); err != nil {
			return 0, 0, err
		}
		pool.SetMaxIdleConns(2) // database/sql's default
		closeAfter = append(closeAfter, pool.Close)
	}
	var opts sqlxoutbox.Options
	var relay *core.Relay
	var timed *timedStore
	pub := &memPublisher{}
	if variant == prodRelay || variant == prodRelayNotify || variant == prodRelayIdle2 {
		// In process, the relay is on the producers' pool, whose writes
		// wake it; with NOTIFY, on a pool of its own, as in another
		// process, so that only the notifications wake it.
		relayDB := pool
		if variant == prodRelayNotify {
			var err error
			if relayDB, err = b.open(""); err != nil {
				return 0, 0, err
			}
			closeAfter = append(closeAfter, relayDB.Close)
		}
		relayBox, err := b.store(relayDB, table, sqlxoutbox.Options{})
		if err != nil {
			return 0, 0, err
		}
		timed = &timedStore{Store: relayBox}
		if relay, err = core.NewRelay(timed, pub, core.RelayOptions{BatchSize: 100, PollInterval: b.c.PollInterval, Cooldown: b.c.Cooldown, Logger: b.quiet}); err != nil {
			return 0, 0, err
		}
	}
	if variant == prodRelayNotify {
		n, err := pgnotify.NewNotifier(b.dsn, pgnotify.NotifierOptions{Channel: table, Logger: b.quiet})
		if err != nil {
			return 0, 0, err
		}
		l, err := pgnotify.NewListener(b.dsn, relay, pgnotify.ListenerOptions{Channel: table, Logger: b.quiet})
		if err != nil {
			return 0, 0, err
		}
		goRun(n.Run)
		goRun(l.Run)
		<-l.Ready()
		opts.Notifier = n
	}
	opts.SkipReadBack = variant == prodEnqueueSkip
	box, err := b.store(pool, table, opts)
	if err != nil {
		return 0, 0, err
	}
	if relay != nil {
		goRun(relay.Run)
	}

	closedBefore := pool.Stats().MaxIdleClosed
	n, el, err := b.produce(ctx, d, func(ctx context.Context, i int) error { return b.produceOrder(ctx, pool, box, variant, i) })
	if err != nil {
		return 0, 0, err
	}
	if relay != nil {
		b.log.Debug("relay beside producers", append([]any{"variant", variant, "published", pub.n.Load(), "committed", n,
			"connections_closed_for_want_of_an_idle_slot", pool.Stats().MaxIdleClosed - closedBefore}, timed.summary()...)...)
	}
	return n, el, nil
}

// produceOrder is the producer's business transaction: an order row and,
// but for the plain variant, its event.
func (b *bench) produceOrder(ctx context.Context, db *sql.DB, box *sqlxoutbox.Outbox, variant string, i int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	payload := orderPayload(i)
	insert, args := orderInsertPG, orderArgs(i, payload)
	ev := core.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i), EventType: "order.created", Payload: []byte(payload)}
	switch variant {
	case prodPlain:
		if _, err := tx.ExecContext(ctx, insert, args...); err != nil {
			return err
		}
	case prodEnqueue, prodEnqueueSkip:
		if _, err := tx.ExecContext(ctx, insert, args...); err != nil {
			return err
		}
		if err := box.Enqueue(ctx, tx, ev); err != nil {
			return err
		}
	case prodHand:
		if _, err := tx.ExecContext(ctx, insert, args...); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+producerTable+"_"+prodHand+
			" (event_id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4, $5)",
			uuid.Must(uuid.NewV7()).String(), ev.AggregateType, ev.AggregateID, ev.EventType, payload); err != nil {
			return err
		}
	case prodHandReturning:
		if _, err := tx.ExecContext(ctx, insert, args...); err != nil {
			return err
		}
		if err := insertReturning(ctx, tx, producerTable+"_"+prodHandReturning, ev.AggregateType, ev.AggregateID, ev.EventType, payload); err != nil {
			return err
		}
	default:
		if _, err := box.ExecWithEvents(ctx, tx, insert, args, ev); err != nil {
			return err
		}
	}
	if variant == prodNotifyPerTx {
		if _, err := tx.ExecContext(ctx, "SELECT pg_notify($1, '')", producerTable); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// insertReturning is the hand-written form of what Enqueue sends for one
// event on PostgreSQL: the row, empty headers, and its id and created_at
// read back.
func insertReturning(ctx context.Context, tx *sql.Tx, table, aggType, aggID, evType, payload string) error {
	rows, err := tx.QueryContext(ctx, "INSERT INTO "+table+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, headers)"+
		" VALUES (CAST($1 AS uuid), $2, $3, $4, CAST($5 AS jsonb), CAST($6 AS jsonb)) RETURNING id, created_at",
		uuid.Must(uuid.NewV7()).String(), aggType, aggID, evType, payload, "{}")
	if err != nil {
		return err
	}
	defer rows.Close()
	var id int64
	var created time.Time
	for rows.Next() {
		if err := rows.Scan(&id, &created); err != nil {
			return err
		}
	}
	return errors.Join(rows.Err(), rows.Close())
}
