// Command readme runs the README's code, as written: the regions between
// "// README: name" and "// README: end" are the README's snippets, and
// main_test.go checks that the README shows exactly them, and runs them
// against PostgreSQL and RabbitMQ.
//
//	. .services/env
//	go run ./examples/readme
//
// It creates an orders table and an outbox in the database of
// TXOUTBOX_PG_DSN, publishes an order's event to RabbitMQ
// (TXOUTBOX_AMQP_URL) and consumes it through the inbox.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/jmoiron/sqlx"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
)

func main() {
	ctx := context.Background()
	dsn, amqpURL := os.Getenv("TXOUTBOX_PG_DSN"), os.Getenv("TXOUTBOX_AMQP_URL")
	if dsn == "" || amqpURL == "" {
		fmt.Fprintln(os.Stderr, "readme: set TXOUTBOX_PG_DSN and TXOUTBOX_AMQP_URL (. .services/env)")
		os.Exit(2)
	}
	res, err := run(ctx, dsn, amqpURL, "inventory")
	if err != nil {
		fmt.Fprintln(os.Stderr, "readme:", err)
		os.Exit(1)
	}
	fmt.Printf("order %d: event %s published to RabbitMQ and taken once by the inventory consumer (%d duplicates absorbed)\n",
		res.orderID, res.eventID, res.duplicates)
}

// result is what run did.
type result struct {
	orderID    int64
	eventID    string
	stock      int
	duplicates int
}

// run is the README's flow: the sqlx producer and relay to RabbitMQ, then
// the inbox consumer; consumer names the consumer group (its queue).
func run(ctx context.Context, dsn, amqpURL, consumer string) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var res result

	db, err := sqlx.Open("pgx", dsn)
	if err != nil {
		return res, err
	}
	defer db.Close()
	// As many idle connections as open ones: database/sql keeps two idle by
	// default, and producers and the relay beyond two would each open a
	// server connection per transaction.
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	if err := dialect.Migrate(ctx, db.DB, dialect.Postgres, dialect.MigrateOptions{}); err != nil {
		return res, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id BIGSERIAL PRIMARY KEY, buyer_id TEXT, total BIGINT)`); err != nil {
		return res, err
	}

	// README: sqlx
	outbox, err := sqlxoutbox.New(db, sqlxoutbox.Options{})
	if err != nil {
		return res, err
	}
	// The relay, here in the same process (or its own: txoutbox relay).
	// The publisher declares the consumer's queue before it subscribes.
	publisher, err := amqpbroker.NewPublisher(amqpbroker.Options{URL: amqpURL, Consumers: []string{consumer}})
	if err != nil {
		return res, err
	}
	defer publisher.Close()
	relay, err := core.NewRelay(outbox, publisher, core.RelayOptions{})
	if err != nil {
		return res, err
	}
	go relay.Run(ctx) // woken by the outbox's commits

	// An order and its event, in one transaction.
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return res, err
	}
	defer tx.Rollback()
	var orderID int64
	if err := tx.QueryRowxContext(ctx,
		`INSERT INTO orders (buyer_id, total) VALUES ($1, $2) RETURNING id`, "b-42", 1999).Scan(&orderID); err != nil {
		return res, err
	}
	ev, err := core.NewEvent("order", strconv.FormatInt(orderID, 10), "order.created",
		map[string]any{"order_id": orderID, "buyer_id": "b-42", "total": 1999})
	if err != nil {
		return res, err
	}
	if err := outbox.Enqueue(ctx, tx, ev); err != nil {
		return res, err
	}
	if err := tx.Commit(); err != nil {
		return res, err
	}
	// README: end
	res.orderID, res.eventID = orderID, ev.ID

	stock, dups, err := consume(ctx, db, amqpURL, consumer, ev.ID)
	res.stock, res.duplicates = stock, dups
	return res, err
}

// consume runs the README's inbox consumer until it took the event with
// eventID, then hands the message to it once more, as a redelivery would.
func consume(ctx context.Context, db *sqlx.DB, amqpURL, consumer, eventID string) (stock, duplicates int, err error) {
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, qty INT)`); err != nil {
		return 0, 0, err
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO stock (sku, qty) VALUES ('apple', 100) ON CONFLICT (sku) DO UPDATE SET qty = 100`); err != nil {
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
	done := make(chan *message.Message, 1)
	var dups int
	sku, qty := "apple", 1
	onDuplicate := func(context.Context, string, string) { dups++ }

	// README: inbox
	ib, err := sqlinbox.New(db, sqlinbox.Options{})
	if err != nil {
		return 0, 0, err
	}
	dedup, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: consumer, OnDuplicate: onDuplicate})
	if err != nil {
		return 0, 0, err
	}
	router.AddMiddleware(dedup)
	router.AddConsumerHandler("decrement-stock", "order.created", sub, func(msg *message.Message) error {
		tx := sqlinbox.Txx(msg.Context()) // the transaction that also records (consumer, event_id)
		_, err := tx.ExecContext(msg.Context(), tx.Rebind(`UPDATE stock SET qty = qty - ? WHERE sku = ?`), qty, sku)
		return err
	})
	// README: end

	// Catch the handled message, to replay it as a redelivery would.
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
	// The same event delivered again takes no effect.
	handler := dedup(func(msg *message.Message) ([]*message.Message, error) {
		return nil, errors.New("the handler ran for a duplicate")
	})
	if _, err := handler(got.Copy()); err != nil {
		return 0, 0, err
	}
	if err := db.GetContext(ctx, &stock, `SELECT qty FROM stock WHERE sku = 'apple'`); err != nil {
		return 0, 0, err
	}
	return stock, dups, nil
}

// Order is the README's GORM model.
type Order struct {
	ID        int64 `gorm:"primaryKey"`
	BuyerID   string
	Total     int64
	CreatedAt time.Time
}

// README: gorm-model
func (o *Order) OutboxEvents(op gormoutbox.Op) ([]core.Event, error) {
	if op != gormoutbox.Create {
		return nil, nil
	}
	// Runs after the INSERT: o.ID and o.CreatedAt are set.
	ev, err := core.NewEvent("order", strconv.FormatInt(o.ID, 10), "order.created",
		map[string]any{"order_id": o.ID, "buyer_id": o.BuyerID, "total": o.Total, "created_at": o.CreatedAt})
	return []core.Event{ev}, err
}

// README: end

// runGORM is the README's GORM flow on dsn, relaying to publisher until
// ctx ends.
func runGORM(ctx context.Context, dsn string, publisher core.Publisher) error {
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return err
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		return err
	}
	log := slog.Default()

	// README: gorm
	if err := db.Use(gormoutbox.Plugin{}); err != nil {
		return err
	}
	if err := gormoutbox.AutoMigrate(db, gormoutbox.MigrateOptions{}); err != nil {
		return err
	}
	store, err := gormoutbox.NewStore(db, gormoutbox.StoreOptions{Logger: log})
	if err != nil {
		return err
	}
	relay, err := core.NewRelay(store, publisher, core.RelayOptions{}) // woken by the plugin's commits
	if err != nil {
		return err
	}
	go relay.Run(ctx)

	// The order and its order.created event, in one transaction.
	if err := db.WithContext(ctx).Create(&Order{BuyerID: "b-42", Total: 1999}).Error; err != nil {
		return err
	}
	// Or explicitly, in your transaction.
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		ev, err := core.NewEvent("order", "42", "order.noted", map[string]string{"note": "gift"})
		if err != nil {
			return err
		}
		return gormoutbox.Enqueue(tx, ev)
	})
	// README: end
	return err
}
