package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/pgnotify"
)

const producerTable = "producer_events"

// Variants of scenario d's producer transaction and what runs beside it.
const (
	prodPlain       = "plain"        // INSERT order; COMMIT
	prodOutbox      = "outbox"       // INSERT order; Enqueue; COMMIT
	prodRelay       = "relay"        // outbox, relay draining beside, woken in-process
	prodRelayNotify = "relay_notify" // outbox, relay draining beside, woken by the debounced NOTIFY
	prodNotifyPerTx = "notify_per_tx"
)

// producers runs scenario d: transactions per second of Producers
// connections inserting an order, with and without the outbox row, and
// with and without a relay draining the outbox beside them.
func (b *bench) producers(ctx context.Context) ([]row, error) {
	if _, err := b.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id BIGSERIAL PRIMARY KEY, customer_id TEXT NOT NULL, amount_cents INT NOT NULL,
		payload JSONB NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		return nil, err
	}
	if _, err := b.outbox(ctx, b.db, producerTable, sqlxoutbox.Options{}); err != nil {
		return nil, err
	}
	variants := []string{prodPlain, prodOutbox, prodRelay, prodRelayNotify, prodNotifyPerTx}
	best := map[string]float64{}
	for round := range b.c.Rounds {
		order := variants
		if round%2 == 1 {
			order = []string{prodNotifyPerTx, prodRelayNotify, prodRelay, prodOutbox, prodPlain}
		}
		for _, v := range order {
			if _, err := b.db.ExecContext(ctx, "TRUNCATE orders, "+producerTable); err != nil {
				return nil, err
			}
			if _, err := b.db.ExecContext(ctx, "VACUUM ANALYZE orders, "+producerTable); err != nil {
				return nil, err
			}
			tps, err := b.producerRun(ctx, v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v, err)
			}
			best[v] = max(best[v], tps)
			b.log.Info("producers", "round", round, "variant", v, "tx_per_s", int(tps))
		}
	}
	clients := fmt.Sprintf("%d clients", b.c.Producers)
	return []row{
		{name: "d  producer tx/s with the outbox row vs without (" + clients + ")", value: best[prodOutbox], baseline: best[prodPlain],
			unit: " tx/s", target: "≥ 85 %", pass: best[prodOutbox] >= 0.85*best[prodPlain], verdict: true},
		{name: "d  producer tx/s with a relay draining beside, in-process wake, vs no relay", value: best[prodRelay], baseline: best[prodOutbox],
			unit: " tx/s", target: "≥ 75 % (cost ≤ 25 %)", pass: best[prodRelay] >= 0.75*best[prodOutbox], verdict: true},
		{name: "d  producer tx/s with a relay draining beside, debounced NOTIFY, vs no relay", value: best[prodRelayNotify], baseline: best[prodOutbox],
			unit: " tx/s", target: "≥ 75 % (cost ≤ 25 %)", pass: best[prodRelayNotify] >= 0.75*best[prodOutbox], verdict: true},
		{name: "d' producer tx/s with pg_notify inside every transaction vs without (why we debounce)", value: best[prodNotifyPerTx], baseline: best[prodOutbox],
			unit: " tx/s", target: "—"},
	}, nil
}

func (b *bench) producerRun(ctx context.Context, variant string) (float64, error) {
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

	var opts sqlxoutbox.Options
	var relay *core.Relay
	pub := &memPublisher{}
	if variant == prodRelay || variant == prodRelayNotify {
		relayBox, err := b.outbox(ctx, b.db, producerTable, sqlxoutbox.Options{})
		if err != nil {
			return 0, err
		}
		if relay, err = core.NewRelay(relayBox, pub, core.RelayOptions{BatchSize: 100, PollInterval: b.c.PollInterval, Cooldown: b.c.Cooldown, Logger: b.quiet}); err != nil {
			return 0, err
		}
		opts.Notifier = relay
	}
	if variant == prodRelayNotify {
		n, err := pgnotify.NewNotifier(b.dsn, pgnotify.NotifierOptions{Channel: producerTable, Logger: b.quiet})
		if err != nil {
			return 0, err
		}
		l, err := pgnotify.NewListener(b.dsn, relay, pgnotify.ListenerOptions{Channel: producerTable, Logger: b.quiet})
		if err != nil {
			return 0, err
		}
		goRun(n.Run)
		goRun(l.Run)
		<-l.Ready()
		opts.Notifier = n
	}
	box, err := b.outbox(ctx, b.db, producerTable, opts)
	if err != nil {
		return 0, err
	}
	if relay != nil {
		goRun(relay.Run)
	}

	var count atomic.Int64
	errs := make(chan error, b.c.Producers)
	var wg sync.WaitGroup
	stopAt := time.Now().Add(b.c.ProducerFor)
	start := time.Now()
	for w := range b.c.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; time.Now().Before(stopAt); i += b.c.Producers {
				if err := b.produceOrder(ctx, box, variant, i); err != nil {
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
		return 0, err
	default:
	}
	if relay != nil {
		b.log.Info("relay beside producers", "variant", variant, "published", pub.n.Load(), "committed", count.Load())
	}
	return float64(count.Load()) / el.Seconds(), nil
}

// produceOrder is the producer's business transaction: an order row and,
// but for the plain variant, its event.
func (b *bench) produceOrder(ctx context.Context, box *sqlxoutbox.Outbox, variant string, i int) error {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	payload := orderPayload(i)
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (customer_id, amount_cents, payload) VALUES ($1, $2, $3)",
		fmt.Sprintf("c-%d", i%9973), (i*37)%100000, payload); err != nil {
		return err
	}
	if variant != prodPlain {
		ev := core.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i), EventType: "order.created", Payload: []byte(payload)}
		if err := box.Enqueue(ctx, tx, ev); err != nil {
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
