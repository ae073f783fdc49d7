package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pgxoutbox "github.com/txoutbox/txoutbox/adapters/pgx"
	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
)

const (
	pgxDrainTable    = "pgx_drain_events"
	pgxProducerTable = "pgx_producer_events"
)

// Variants of scenario f's producer transaction: the same transaction as
// scenario d's enqueue and outbox variants, through database/sql and
// through pgx.
const (
	fSQLEnqueue  = "sql_enqueue"
	fPgxEnqueue  = "pgx_enqueue"
	fSQLExecWith = "sql_execwith"
	fPgxExecWith = "pgx_execwith"
)

// pgxPool opens a pgx pool on the bench database, sized as b.open's
// database/sql pools.
func (b *bench) pgxPool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(b.dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 32
	return pgxpool.NewWithConfig(ctx, cfg)
}

// pgxScenario runs scenario f: the pgx adapter against the sqlx adapter on
// the same database, producer transactions per second (taking turns as in
// d) and relay drain (taking turns batch by batch as in a).
func (b *bench) pgxScenario(ctx context.Context) ([]row, error) {
	pool, err := b.pgxPool(ctx)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	// Producers: one table per side, so that the sides never wait on each
	// other's index pages.
	if _, err := b.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id BIGSERIAL PRIMARY KEY, customer_id TEXT NOT NULL, amount_cents INT NOT NULL,
		payload JSONB NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		return nil, err
	}
	variants := []string{fSQLEnqueue, fPgxEnqueue, fSQLExecWith, fPgxExecWith}
	sqlBoxes := map[string]*sqlxoutbox.Outbox{}
	pgxBoxes := map[string]*pgxoutbox.Outbox{}
	for _, v := range variants {
		table := pgxProducerTable + "_" + v
		box, err := b.outbox(ctx, b.db, table, sqlxoutbox.Options{})
		if err != nil {
			return nil, err
		}
		sqlBoxes[v] = box
		if pgxBoxes[v], err = pgxoutbox.New(pool, pgxoutbox.Options{Table: table, Logger: b.quiet}); err != nil {
			return nil, err
		}
	}
	rate, _, err := b.rotate(ctx, "pgx producers", variants, func(v string, d time.Duration) (int64, time.Duration, error) {
		return b.produce(ctx, d, func(ctx context.Context, i int) error {
			switch v {
			case fPgxEnqueue, fPgxExecWith:
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return producePgx(ctx, pgxBoxes[v], tx, v == fPgxExecWith, i) })
			}
			return b.produceOrder(ctx, b.db, sqlBoxes[v], map[string]string{fSQLEnqueue: prodEnqueue, fSQLExecWith: prodOutbox}[v], i)
		})
	})
	if err != nil {
		return nil, err
	}

	// Drain: the relay on each store, over one backlog.
	sqlStore, err := b.outbox(ctx, b.db, pgxDrainTable, sqlxoutbox.Options{})
	if err != nil {
		return nil, err
	}
	pgxStore, err := pgxoutbox.New(pool, pgxoutbox.Options{Table: pgxDrainTable, Logger: b.quiet})
	if err != nil {
		return nil, err
	}
	sqlBatch, err := b.relayBatch(ctx, sqlStore)
	if err != nil {
		return nil, err
	}
	pgxBatch, err := b.relayBatch(ctx, pgxStore)
	if err != nil {
		return nil, err
	}
	sides := []drainSide{{name: "sqlx", batch: sqlBatch}, {name: "pgx", batch: pgxBatch}}
	if err := b.takeTurns(ctx, "pgx drain", b.filler(pgxDrainTable), sides); err != nil {
		return nil, err
	}
	clients := fmt.Sprintf("%d clients", b.c.Producers)
	return []row{
		{name: "f  producer tx/s, Enqueue in a pgx.Tx (pgxoutbox) vs in a *sql.Tx (sqlxoutbox), " + clients, value: rate[fPgxEnqueue], baseline: rate[fSQLEnqueue],
			unit: " tx/s", target: "—"},
		{name: "f' producer tx/s, ExecWithEvents in a pgx.Tx vs in a *sql.Tx", value: rate[fPgxExecWith], baseline: rate[fSQLExecWith],
			unit: " tx/s", target: "—"},
		{name: "f  relay drain on the pgxpool store vs the sqlx store (events/s, batch 100, 1 worker)", value: sides[1].rate(), baseline: sides[0].rate(),
			unit: "/s", target: "—"},
	}, nil
}

// producePgx is produceOrder's transaction on pgx: an order row and its
// event, in two statements (Enqueue) or one (ExecWithEvents).
func producePgx(ctx context.Context, box *pgxoutbox.Outbox, tx pgx.Tx, execWith bool, i int) error {
	payload := orderPayload(i)
	args := orderArgs(i, payload)
	ev := core.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i), EventType: "order.created", Payload: []byte(payload)}
	if execWith {
		_, err := box.ExecWithEvents(ctx, tx, orderInsertPG, args, ev)
		return err
	}
	if _, err := tx.Exec(ctx, orderInsertPG, args...); err != nil {
		return err
	}
	return box.Enqueue(ctx, tx, ev)
}

// orderInsertPG is the order row's INSERT on PostgreSQL, with orderArgs.
const orderInsertPG = "INSERT INTO orders (customer_id, amount_cents, payload) VALUES ($1, $2, $3)"

// orderArgs are the i-th order row's values; payload is orderPayload(i).
func orderArgs(i int, payload string) []any {
	return []any{fmt.Sprintf("c-%d", i%9973), (i * 37) % 100000, payload}
}
