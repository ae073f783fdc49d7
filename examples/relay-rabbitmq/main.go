// Command relay-rabbitmq runs a txoutbox relay from a PostgreSQL outbox to
// RabbitMQ: each event goes, persistent and confirmed, to the durable
// exchange of its event type (or to one topic exchange with -exchange).
//
//	go run ./examples/relay-rabbitmq -dsn 'postgres://app@db/shop' \
//	    -url 'amqps://relay:secret@rabbit.internal:5671/shop' -consumers billing,shipping
//
// Against the services of make test, writing five demo orders first and
// stopping once the outbox is empty:
//
//	. .services/env
//	go run ./examples/relay-rabbitmq -demo 5 -once -consumers demo
//
// Flags default to the environment: TXOUTBOX_PG_DSN, TXOUTBOX_AMQP_URL.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

type config struct {
	DSN, URL, Exchange, Consumers string
	Demo                          int
	Once                          bool
}

func main() {
	var c config
	flag.StringVar(&c.DSN, "dsn", os.Getenv("TXOUTBOX_PG_DSN"), "PostgreSQL DSN of the outbox database (env TXOUTBOX_PG_DSN)")
	flag.StringVar(&c.URL, "url", os.Getenv("TXOUTBOX_AMQP_URL"), "AMQP URL with credentials and vhost; amqps:// for TLS (env TXOUTBOX_AMQP_URL)")
	flag.StringVar(&c.Exchange, "exchange", "", "one topic exchange for all events, routing key = event type; empty: a fanout exchange per event type")
	flag.StringVar(&c.Consumers, "consumers", "", "comma-separated consumer groups whose durable queues the relay declares, so no event is unroutable")
	flag.IntVar(&c.Demo, "demo", 0, "write this many demo orders with their order.created events first")
	flag.BoolVar(&c.Once, "once", false, "publish what is due and exit")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	n, err := run(ctx, c, log)
	if err != nil {
		log.Error("relay-rabbitmq failed", "error", err)
		os.Exit(1)
	}
	fmt.Printf("published %d events, %d failed attempts\n", n.Published, n.Failed)
}

func run(ctx context.Context, c config, log *slog.Logger) (core.RelayCounters, error) {
	if c.DSN == "" || c.URL == "" {
		return core.RelayCounters{}, errors.New("set -dsn and -url (or TXOUTBOX_PG_DSN and TXOUTBOX_AMQP_URL)")
	}
	db, err := sqlx.Open("pgx", c.DSN)
	if err != nil {
		return core.RelayCounters{}, err
	}
	defer db.Close()
	// database/sql keeps two idle connections by default; with more
	// concurrent users every further transaction would open (and then
	// close) a server connection. Keep as many idle as may be open.
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	if err := dialect.Migrate(ctx, db.DB, dialect.Postgres, dialect.MigrateOptions{Logger: log}); err != nil {
		return core.RelayCounters{}, fmt.Errorf("migrate: %w", err)
	}
	box, err := sqlxoutbox.New(db, sqlxoutbox.Options{Logger: log})
	if err != nil {
		return core.RelayCounters{}, err
	}

	opts := amqpbroker.Options{URL: c.URL, Logger: log}
	if c.Exchange != "" {
		opts.Topology = amqpbroker.Topology{Exchange: c.Exchange, ExchangeType: amqpbroker.ExchangeTopic}
	}
	if c.Consumers != "" {
		opts.Consumers = strings.Split(c.Consumers, ",")
	}
	pub, err := amqpbroker.NewPublisher(opts)
	if err != nil {
		return core.RelayCounters{}, err
	}
	defer pub.Close()

	relay, err := core.NewRelay(box, pub, core.RelayOptions{Logger: log})
	if err != nil {
		return core.RelayCounters{}, err
	}
	if err := writeDemoOrders(ctx, db, box, c.Demo); err != nil {
		return core.RelayCounters{}, err
	}
	if c.Once {
		_, err := relay.Drain(ctx)
		return relay.Counters(), err
	}
	log.Info("relaying to RabbitMQ; interrupt to stop")
	err = relay.Run(ctx)
	return relay.Counters(), err
}

// writeDemoOrders writes n orders, each with its event in the same
// transaction, as a producer does.
func writeDemoOrders(ctx context.Context, db *sqlx.DB, box *sqlxoutbox.Outbox, n int) error {
	if n == 0 {
		return nil
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS demo_orders (id TEXT PRIMARY KEY, total_cents INTEGER NOT NULL)`); err != nil {
		return err
	}
	for i := range n {
		ev, err := core.NewEvent("order", "", "order.created", map[string]any{"total_cents": 1000 + i})
		if err != nil {
			return err
		}
		if err := ev.Prepare(); err != nil { // assigns the event ID, used as order ID
			return err
		}
		ev.AggregateID = ev.ID
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO demo_orders (id, total_cents) VALUES ($1, $2)`, ev.ID, 1000+i); err != nil {
			tx.Rollback()
			return err
		}
		if err := box.Enqueue(ctx, tx, ev); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}
