// Command relay-kafka runs a txoutbox relay from a PostgreSQL outbox to
// Kafka: each event becomes a record of the topic named after its event type
// (or renamed with -topic-map), keyed by aggregate ID, written with acks=all
// by an idempotent producer.
//
//	go run ./examples/relay-kafka -dsn 'postgres://app@db/shop' \
//	    -brokers kafka-1:9092,kafka-2:9092 -topic-map order.created=orders
//
// Without a Kafka cluster, -fake starts an in-process Kafka-protocol cluster
// (kfake) to relay to; with the PostgreSQL of make test, writing five demo
// orders first and stopping once the outbox is empty:
//
//	. .services/env
//	go run ./examples/relay-kafka -fake -demo 5 -once
//
// Flags default to the environment: TXOUTBOX_PG_DSN, TXOUTBOX_KAFKA_BROKERS.
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
	"github.com/twmb/franz-go/pkg/kfake"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

type config struct {
	DSN, Brokers, TopicMap string
	Fake                   bool
	Demo                   int
	Once                   bool
}

func main() {
	var c config
	flag.StringVar(&c.DSN, "dsn", os.Getenv("TXOUTBOX_PG_DSN"), "PostgreSQL DSN of the outbox database (env TXOUTBOX_PG_DSN)")
	flag.StringVar(&c.Brokers, "brokers", os.Getenv("TXOUTBOX_KAFKA_BROKERS"), "comma-separated Kafka bootstrap addresses (env TXOUTBOX_KAFKA_BROKERS)")
	flag.StringVar(&c.TopicMap, "topic-map", "", "comma-separated event.type=topic renames; other events go to the topic of their type")
	flag.BoolVar(&c.Fake, "fake", false, "relay to an in-process kfake cluster instead of -brokers")
	flag.IntVar(&c.Demo, "demo", 0, "write this many demo orders with their order.created events first")
	flag.BoolVar(&c.Once, "once", false, "publish what is due and exit")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	n, err := run(ctx, c, log)
	if err != nil {
		log.Error("relay-kafka failed", "error", err)
		os.Exit(1)
	}
	fmt.Printf("published %d events, %d failed attempts\n", n.Published, n.Failed)
}

func run(ctx context.Context, c config, log *slog.Logger) (core.RelayCounters, error) {
	brokers := strings.Split(c.Brokers, ",")
	if c.Fake {
		cluster, err := kfake.NewCluster(kfake.AllowAutoTopicCreation())
		if err != nil {
			return core.RelayCounters{}, err
		}
		defer cluster.Close()
		brokers = cluster.ListenAddrs()
	}
	if c.DSN == "" || brokers[0] == "" {
		return core.RelayCounters{}, errors.New("set -dsn and -brokers (or TXOUTBOX_PG_DSN and TXOUTBOX_KAFKA_BROKERS), or -fake")
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

	renames := map[string]string{}
	for _, kv := range strings.Split(c.TopicMap, ",") {
		if from, to, ok := strings.Cut(kv, "="); ok {
			renames[from] = to
		}
	}
	// TLS or SASL: pass kgo.DialTLSConfig / kgo.SASL as Options.Client.
	pub, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: brokers, Topic: kafkabroker.TopicMap(renames)})
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
	log.Info("relaying to Kafka; interrupt to stop", "brokers", brokers)
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
