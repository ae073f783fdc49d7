// Command pgx-orders is a service on pgx with no database/sql in its code:
// it writes an order and its order.created event in one pgx.Tx, relays the
// event from its pgxpool to RabbitMQ, and consumes it with the inbox on
// pgx, which takes stock once even when the message comes twice.
//
//	. .services/env
//	go run ./examples/pgx-orders
//
// It creates its tables in the database of TXOUTBOX_PG_DSN and publishes to
// the RabbitMQ of TXOUTBOX_AMQP_URL. The regions between "// README: name"
// and "// README: end" are the README's pgx snippets.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pgxoutbox "github.com/txoutbox/txoutbox/adapters/pgx"
	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/inbox/pgxinbox"
)

func main() {
	dsn, amqpURL := os.Getenv("TXOUTBOX_PG_DSN"), os.Getenv("TXOUTBOX_AMQP_URL")
	if dsn == "" || amqpURL == "" {
		fmt.Fprintln(os.Stderr, "pgx-orders: set TXOUTBOX_PG_DSN and TXOUTBOX_AMQP_URL (. .services/env)")
		os.Exit(2)
	}
	res, err := run(context.Background(), dsn, amqpURL, "pgx-inventory")
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgx-orders:", err)
		os.Exit(1)
	}
	fmt.Printf("order %d: event %s published to RabbitMQ; stock %d after one effect (%d redelivery absorbed)\n",
		res.orderID, res.eventID, res.stock, res.duplicates)
}

// result is what run did.
type result struct {
	orderID    int64
	eventID    string
	stock      int
	duplicates int
}

// run writes an order with its event, relays it and consumes it as
// consumer, then hands the consumer the same message again.
func run(ctx context.Context, dsn, amqpURL, consumer string) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var res result

	// README: pgx
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	if err := pgxoutbox.Migrate(ctx, pool, dialect.MigrateOptions{}); err != nil {
		return res, err
	}
	outbox, err := pgxoutbox.New(pool, pgxoutbox.Options{})
	if err != nil {
		return res, err
	}
	publisher, err := amqpbroker.NewPublisher(amqpbroker.Options{URL: amqpURL, Consumers: []string{consumer}})
	if err != nil {
		return res, err
	}
	defer publisher.Close()
	relay, err := core.NewRelay(outbox, publisher, core.RelayOptions{}) // woken by the outbox's writes on this pool
	if err != nil {
		return res, err
	}
	go relay.Run(ctx)

	// An order and its event, in one pgx.Tx.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id BIGSERIAL PRIMARY KEY, buyer_id TEXT, total BIGINT)`); err != nil {
		return res, err
	}
	var orderID int64
	var ev core.Event
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `INSERT INTO orders (buyer_id, total) VALUES ($1, $2) RETURNING id`, "b-42", 1999).Scan(&orderID)
		if err != nil {
			return err
		}
		ev, err = core.NewEvent("order", strconv.FormatInt(orderID, 10), "order.created",
			map[string]any{"order_id": orderID, "buyer_id": "b-42", "total": 1999})
		if err != nil {
			return err
		}
		return outbox.Enqueue(ctx, tx, ev)
	})
	if err != nil {
		return res, err
	}
	// README: end
	res.orderID, res.eventID = orderID, ev.ID
	res.stock, res.duplicates, err = consume(ctx, pool, amqpURL, consumer, ev.ID)
	return res, err
}

// consume runs the inbox consumer on pgx until it took the event with
// eventID, then hands the message to it once more, as a redelivery would.
func consume(ctx context.Context, pool *pgxpool.Pool, amqpURL, consumer, eventID string) (stock, duplicates int, err error) {
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, qty INT)`); err != nil {
		return 0, 0, err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO stock (sku, qty) VALUES ('apple', 100) ON CONFLICT (sku) DO UPDATE SET qty = 100`); err != nil {
		return 0, 0, err
	}
	sub, err := amqpbroker.NewSubscriber(amqpbroker.SubscriberOptions{URL: amqpURL, Consumer: consumer})
	if err != nil {
		return 0, 0, err
	}
	defer sub.Close()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return 0, 0, err
	}
	onDuplicate := func(context.Context, string, string) { duplicates++ }

	// README: pgx-inbox
	ib, err := pgxinbox.New(pool, pgxinbox.Options{})
	if err != nil {
		return 0, 0, err
	}
	dedup, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: consumer, OnDuplicate: onDuplicate})
	if err != nil {
		return 0, 0, err
	}
	router.AddMiddleware(dedup)
	router.AddConsumerHandler("take-stock", "order.created", sub, func(msg *message.Message) error {
		tx := pgxinbox.Tx(msg.Context()) // the pgx.Tx that also records (consumer, event_id)
		_, err := tx.Exec(msg.Context(), `UPDATE stock SET qty = qty - 1 WHERE sku = $1`, "apple")
		return err
	})
	// README: end

	done := make(chan *message.Message, 1)
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && msg.Metadata.Get(core.HeaderEventID) == eventID {
				select {
				case done <- msg:
				default:
				}
			}
			return out, err
		}
	})
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = router.Run(rctx) }()
	var got *message.Message
	select {
	case got = <-done:
	case <-ctx.Done():
		return 0, 0, fmt.Errorf("the event %s never reached the consumer: %w", eventID, ctx.Err())
	}
	handler := dedup(func(msg *message.Message) ([]*message.Message, error) {
		return nil, errors.New("the handler ran for a duplicate")
	})
	if _, err := handler(got.Copy()); err != nil {
		return 0, 0, err
	}
	err = pool.QueryRow(ctx, `SELECT qty FROM stock WHERE sku = 'apple'`).Scan(&stock)
	return stock, duplicates, err
}
