// Command inventory-consumer is a consumer service built on the txoutbox
// inbox: it decrements stock for every order.created event, exactly once per
// event however often the broker delivers it.
//
// With RabbitMQ and PostgreSQL (what a real deployment looks like):
//
//	go run ./examples/inventory-consumer \
//	    -db postgres -dsn "$TXOUTBOX_PG_DSN" -broker amqp -amqp "$TXOUTBOX_AMQP_URL"
//
// With nothing installed (SQLite file, in-process GoChannel, and a demo
// producer that sends every order twice):
//
//	go run ./examples/inventory-consumer -demo
//
// The handler writes through the inbox's transaction (sqlinbox.Txx), so the
// stock update and the record of the event commit together: a crash between
// them is impossible, and a redelivered event is acked without touching the
// stock again.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // the pure-Go "sqlite" database/sql driver

	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
)

// config is everything the service reads from flags and the environment.
type config struct {
	DB       string // "postgres" or "sqlite"
	DSN      string
	Broker   string // "amqp" or "gochannel"
	AMQPURL  string
	Consumer string
	Topic    string
	Demo     bool // publish demo orders (each twice) and exit when done
	Orders   int  // demo orders
	FailFast bool // exit when the database or the broker is down at start
	Log      *slog.Logger
}

// errUnknownSKU is a permanent failure: redelivering will not make the SKU
// exist, so the message goes to the poison topic instead.
var errUnknownSKU = errors.New("inventory: unknown SKU")

// OrderCreated is the payload of an order.created event.
type OrderCreated struct {
	OrderID string `json:"order_id"`
	Items   []struct {
		SKU string `json:"sku"`
		Qty int    `json:"qty"`
	} `json:"items"`
}

func main() {
	cfg := config{Log: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	flag.StringVar(&cfg.DB, "db", envOr("INVENTORY_DB", "sqlite"), "database: postgres or sqlite (env INVENTORY_DB)")
	flag.StringVar(&cfg.DSN, "dsn", envOr("INVENTORY_DSN", defaultSQLiteDSN()), "database DSN (env INVENTORY_DSN)")
	flag.StringVar(&cfg.Broker, "broker", envOr("INVENTORY_BROKER", "gochannel"), "broker: amqp or gochannel (env INVENTORY_BROKER)")
	flag.StringVar(&cfg.AMQPURL, "amqp", os.Getenv("TXOUTBOX_AMQP_URL"), "RabbitMQ URL (env TXOUTBOX_AMQP_URL)")
	flag.StringVar(&cfg.Consumer, "consumer", "inventory", "consumer name: the deduplication scope and the AMQP consumer group")
	flag.StringVar(&cfg.Topic, "topic", "order.created", "topic to consume")
	flag.BoolVar(&cfg.Demo, "demo", false, "publish demo orders, each twice, print the stock and exit")
	flag.IntVar(&cfg.Orders, "orders", 5, "number of demo orders")
	flag.BoolVar(&cfg.FailFast, "fail-fast", false, "exit when the database or the broker is down at start, instead of waiting for them")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		cfg.Log.Error("inventory-consumer failed", "error", err)
		os.Exit(1)
	}
}

// defaultSQLiteDSN keeps the demo's database out of the working tree. Every
// connection gets the busy timeout, so that concurrent writers wait.
func defaultSQLiteDSN() string {
	return "file:" + filepath.Join(os.TempDir(), "txoutbox-inventory.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)"
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// await calls try until it succeeds, logging once when the dependency is
// down and once when it answers, with backoff; with FailFast, or when ctx
// ends, it returns the error.
func await(ctx context.Context, cfg config, what string, try func() error) error {
	wait, down := 200*time.Millisecond, false
	for {
		err := try()
		if err == nil {
			if down {
				cfg.Log.Info("inventory: "+what+" answers; starting", "dependency", what)
			}
			return nil
		}
		if cfg.FailFast || ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if !down {
			down = true
			cfg.Log.Warn("inventory: "+what+" does not answer; retrying until it does (-fail-fast exits instead)", "error", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 15*time.Second)
	}
}

// run starts the service and returns when ctx ends (or, in demo mode, when
// the demo orders were consumed).
func run(ctx context.Context, cfg config, out io.Writer) error {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	d, driver, err := pickDB(cfg.DB)
	if err != nil {
		return err
	}
	sqlDB, err := sql.Open(driver, cfg.DSN)
	if err != nil {
		return fmt.Errorf("open %s: %w", cfg.DB, err)
	}
	defer sqlDB.Close()
	// database/sql keeps two idle connections by default; with more
	// concurrent users every further transaction would open (and then
	// close) a server connection. Keep as many idle as may be open.
	sqlDB.SetMaxOpenConns(16)
	sqlDB.SetMaxIdleConns(16)
	db := sqlx.NewDb(sqlDB, driver)

	// The inbox table comes from the shared migrations (this service has no
	// outbox of its own); stock is the service's own table. A database that
	// is down at start is waited for: under a supervisor, exiting would be a
	// crash loop.
	if err := await(ctx, cfg, "database", func() error {
		return dialect.Migrate(ctx, sqlDB, d, dialect.MigrateOptions{SkipOutbox: true, Logger: cfg.Log})
	}); err != nil {
		return err
	}
	if err := setupStock(ctx, db); err != nil {
		return err
	}

	ib, err := sqlinbox.New(db, sqlinbox.Options{Dialect: d, Logger: cfg.Log})
	if err != nil {
		return err
	}
	if _, err := ib.CheckSQLite(ctx); err != nil {
		return err
	}
	dedup, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: cfg.Consumer, Logger: cfg.Log})
	if err != nil {
		return err
	}

	var br *broker
	if err := await(ctx, cfg, "broker", func() (err error) {
		br, err = openBroker(cfg)
		return err
	}); err != nil {
		return err
	}
	defer br.close()

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NewSlogLogger(cfg.Log))
	if err != nil {
		return err
	}
	// Messages without event_id and orders for unknown SKUs cannot succeed
	// on redelivery: park them on a poison topic. Transient failures (the
	// database is down) are retried, each attempt in a fresh inbox
	// transaction because the inbox is the innermost middleware.
	poison, err := middleware.PoisonQueueWithFilter(br.poison, cfg.Consumer+".poison", func(err error) bool {
		return inbox.IsMissingEventID(err) || errors.Is(err, errUnknownSKU)
	})
	if err != nil {
		return err
	}
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond, Logger: watermill.NewSlogLogger(cfg.Log)}
	// The demo is done when every delivery of its orders (each is sent
	// twice) has come back through the inbox: applied and committed, or
	// skipped as a duplicate. The handler's own return comes before the
	// inbox commits, so counting there would stop the demo, and roll
	// back, an order still committing.
	var handled, delivered atomic.Int64
	done := make(chan struct{})
	var doneOnce sync.Once
	countDeliveries := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && cfg.Demo && delivered.Add(1) >= 2*int64(cfg.Orders) {
				doneOnce.Do(func() { close(done) })
			}
			return out, err
		}
	}
	router.AddMiddleware(middleware.Recoverer, poison, retry.Middleware, countDeliveries, dedup)

	router.AddConsumerHandler("decrement-stock", cfg.Topic, br.sub, func(msg *message.Message) error {
		if err := decrementStock(msg); err != nil {
			return err
		}
		handled.Add(1)
		return nil
	})

	// Old inbox records go after 45 days (longer than the producer's 30-day
	// outbox retention), in batches.
	go func() { _ = inbox.RunCleanup(ctx, ib, inbox.CleanupOptions{Logger: cfg.Log}) }()

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(rctx) }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return fmt.Errorf("router: %w", err)
	}

	if cfg.Demo {
		if err := publishDemo(ctx, br.demo, cfg); err != nil {
			return err
		}
		select {
		case <-done:
		case <-ctx.Done():
		case <-time.After(time.Minute):
			return errors.New("demo orders were not all consumed within a minute")
		}
		cancel()
		if err := <-routerDone; err != nil {
			return err
		}
		return printStock(ctx, db, out, handled.Load())
	}
	<-ctx.Done()
	cancel()
	return <-routerDone
}

func pickDB(name string) (dialect.Dialect, string, error) {
	switch name {
	case "postgres":
		return dialect.Postgres, "pgx", nil
	case "sqlite":
		return dialect.SQLite, "sqlite", nil
	}
	return dialect.Dialect{}, "", fmt.Errorf("-db %q: want postgres or sqlite", name)
}

// broker is the service's side of the broker: the subscription, a
// Watermill publisher for the poison topic, and the core.Publisher the demo
// producer uses (as the relay would).
type broker struct {
	sub    message.Subscriber
	poison message.Publisher
	demo   core.Publisher
	close  func()
}

func openBroker(cfg config) (*broker, error) {
	topic := func(*core.Event) string { return cfg.Topic }
	switch cfg.Broker {
	case "gochannel":
		ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NewSlogLogger(cfg.Log))
		demo := watermillbroker.NewPublisher(ps, watermillbroker.Options{Topic: topic})
		return &broker{sub: ps, poison: ps, demo: demo, close: func() { ps.Close() }}, nil
	case "amqp":
		if cfg.AMQPURL == "" {
			return nil, errors.New("-broker amqp needs -amqp or TXOUTBOX_AMQP_URL")
		}
		// The queue is the consumer group: every instance started with the
		// same -consumer shares it, and the inbox absorbs the duplicates
		// that redeliveries between them cause.
		sub, err := amqpbroker.NewSubscriber(amqpbroker.SubscriberOptions{URL: cfg.AMQPURL, Consumer: cfg.Consumer, Logger: cfg.Log})
		if err != nil {
			return nil, err
		}
		// Poisoned messages wait in a durable queue of their own for a
		// human to look at.
		poison, err := wamqp.NewPublisher(wamqp.NewDurableQueueConfig(cfg.AMQPURL), watermill.NewSlogLogger(cfg.Log))
		if err != nil {
			sub.Close()
			return nil, err
		}
		demo, err := amqpbroker.NewPublisher(amqpbroker.Options{URL: cfg.AMQPURL, Topic: topic, Consumers: []string{cfg.Consumer}, Logger: cfg.Log})
		if err != nil {
			sub.Close()
			poison.Close()
			return nil, err
		}
		return &broker{sub: sub, poison: poison, demo: demo, close: func() { demo.Close(); poison.Close(); sub.Close() }}, nil
	}
	return nil, fmt.Errorf("-broker %q: want amqp or gochannel", cfg.Broker)
}

func setupStock(ctx context.Context, db *sqlx.DB) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("create stock: %w", err)
	}
	for _, sku := range []string{"apple", "pear"} {
		q := db.Rebind(`INSERT INTO stock (sku, qty) VALUES (?, 100) ON CONFLICT DO NOTHING`)
		if _, err := db.ExecContext(ctx, q, sku); err != nil {
			return fmt.Errorf("seed stock: %w", err)
		}
	}
	return nil
}

// decrementStock is the business logic. Everything it writes goes through
// the inbox's transaction.
func decrementStock(msg *message.Message) error {
	var order OrderCreated
	if err := json.Unmarshal(msg.Payload, &order); err != nil {
		return fmt.Errorf("%w: payload: %w", errUnknownSKU, err)
	}
	ctx := msg.Context()
	tx := sqlinbox.Txx(ctx)
	for _, it := range order.Items {
		res, err := tx.ExecContext(ctx, tx.Rebind(`UPDATE stock SET qty = qty - ? WHERE sku = ?`), it.Qty, it.SKU)
		if err != nil {
			return fmt.Errorf("decrement %s: %w", it.SKU, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			// The whole order rolls back, inbox record included.
			return fmt.Errorf("%w %q in order %s", errUnknownSKU, it.SKU, order.OrderID)
		}
	}
	return nil
}

// publishDemo sends cfg.Orders order.created events through pub, as the
// relay would, and each twice, as an at-least-once broker may deliver them.
func publishDemo(ctx context.Context, pub core.Publisher, cfg config) error {
	for i := range cfg.Orders {
		ev, err := core.NewEvent("order", fmt.Sprintf("o-%d", i), "order.created", map[string]any{
			"order_id": fmt.Sprintf("o-%d", i),
			"items":    []map[string]any{{"sku": "apple", "qty": 2}, {"sku": "pear", "qty": 1}},
		})
		if err != nil {
			return err
		}
		if err := ev.Prepare(); err != nil {
			return err
		}
		if err := pub.Publish(ctx, []core.Event{ev, ev}); err != nil {
			return fmt.Errorf("publish demo order: %w", err)
		}
	}
	return nil
}

func printStock(ctx context.Context, db *sqlx.DB, out io.Writer, handled int64) error {
	var rows []struct {
		SKU string `db:"sku"`
		Qty int    `db:"qty"`
	}
	if err := db.SelectContext(ctx, &rows, `SELECT sku, qty FROM stock ORDER BY sku`); err != nil {
		return err
	}
	fmt.Fprintf(out, "orders handled: %d\n", handled)
	for _, r := range rows {
		fmt.Fprintf(out, "stock %s: %d\n", r.SKU, r.Qty)
	}
	return nil
}
