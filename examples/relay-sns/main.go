// Command relay-sns runs a txoutbox relay that publishes the outbox of a
// PostgreSQL database to AWS SNS, one topic per event type, batching with
// PublishBatch and retrying exactly the events SNS refused.
//
// Against AWS, with the standard configuration (AWS_REGION or -region,
// credentials from the default chain: environment, profile, instance or task
// role):
//
//	go run ./examples/relay-sns -dsn 'postgres://app@db/shop' -region eu-west-1
//
// Against the goaws emulator of make test (which has no PublishBatch, hence
// -max-batch 1; it accepts any credentials, but the SDK needs some), writing
// ten demo orders first and stopping once the outbox is empty:
//
//	. .services/env
//	AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test go run ./examples/relay-sns \
//	    -dsn "$TXOUTBOX_PG_DSN" -endpoint "$TXOUTBOX_SNS_ENDPOINT" -region us-east-1 \
//	    -max-batch 1 -demo 10 -once
//
// Every flag has an environment variable: TXOUTBOX_PG_DSN, SNS_ENDPOINT,
// AWS_REGION, SNS_TOPIC_ARN_PREFIX. The SDK itself also honours
// AWS_ENDPOINT_URL_SNS.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	snsbroker "github.com/txoutbox/txoutbox/brokers/sns"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// config is what the flags select.
type config struct {
	DSN            string
	Endpoint       string
	Region         string
	TopicARNPrefix string
	CreateTopics   bool
	MaxBatch       int
	BatchSize      int
	Migrate        bool
	Demo           int
	Once           bool
}

func main() {
	var c config
	flag.StringVar(&c.DSN, "dsn", os.Getenv("TXOUTBOX_PG_DSN"), "PostgreSQL DSN of the database holding the outbox (env TXOUTBOX_PG_DSN)")
	flag.StringVar(&c.Endpoint, "endpoint", os.Getenv("SNS_ENDPOINT"), "SNS endpoint URL, for an emulator; empty: AWS (env SNS_ENDPOINT)")
	flag.StringVar(&c.Region, "region", os.Getenv("AWS_REGION"), "AWS region; empty: from the shared config (env AWS_REGION)")
	flag.StringVar(&c.TopicARNPrefix, "topic-arn-prefix", os.Getenv("SNS_TOPIC_ARN_PREFIX"), `topic ARN = prefix + topic name, e.g. "arn:aws:sns:eu-west-1:123456789012:"; used with -create-topics=false (env SNS_TOPIC_ARN_PREFIX)`)
	flag.BoolVar(&c.CreateTopics, "create-topics", true, "create missing topics (CreateTopic is idempotent; needs sns:CreateTopic)")
	flag.IntVar(&c.MaxBatch, "max-batch", 10, "events per PublishBatch call, 1..10; 1 uses Publish (goaws)")
	flag.IntVar(&c.BatchSize, "batch-size", 100, "events per relay claim")
	flag.BoolVar(&c.Migrate, "migrate", true, "create or update the outbox tables first")
	flag.IntVar(&c.Demo, "demo", 0, "write this many demo orders, each with an order.created event, before relaying")
	flag.BoolVar(&c.Once, "once", false, "publish what is due and exit, instead of running until interrupted")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, c, log)
	if err != nil {
		log.Error("relay-sns failed", "error", err)
		os.Exit(1)
	}
	fmt.Printf("published %d events, %d failed attempts\n", res.Published, res.Failed)
}

// run relays until ctx ends, or once through the outbox with c.Once, and
// returns the relay's totals.
func run(ctx context.Context, c config, log *slog.Logger) (core.RelayCounters, error) {
	if c.DSN == "" {
		return core.RelayCounters{}, errors.New("no database: set -dsn or TXOUTBOX_PG_DSN")
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
	if c.Migrate {
		if err := dialect.Migrate(ctx, db.DB, dialect.Postgres, dialect.MigrateOptions{Logger: log}); err != nil {
			return core.RelayCounters{}, fmt.Errorf("migrate: %w", err)
		}
	}

	// A relay on this outbox wakes up as soon as this process enqueues;
	// events written by other processes are found at the next poll.
	box, err := sqlxoutbox.New(db, sqlxoutbox.Options{Logger: log})
	if err != nil {
		return core.RelayCounters{}, err
	}

	client, err := snsbroker.NewClient(ctx, snsbroker.ClientOptions{Region: c.Region, Endpoint: c.Endpoint})
	if err != nil {
		return core.RelayCounters{}, err
	}
	pub, err := snsbroker.NewPublisher(client, snsbroker.Options{
		CreateTopics:   c.CreateTopics,
		TopicARNPrefix: c.TopicARNPrefix,
		MaxBatchSize:   c.MaxBatch,
		Logger:         log,
	})
	if err != nil {
		return core.RelayCounters{}, err
	}
	defer pub.Close()
	relay, err := core.NewRelay(box, pub, core.RelayOptions{BatchSize: c.BatchSize, Logger: log})
	if err != nil {
		return core.RelayCounters{}, err
	}

	if c.Demo > 0 {
		if err := writeDemoOrders(ctx, db, box, c.Demo); err != nil {
			return core.RelayCounters{}, err
		}
	}
	if c.Once {
		// Drain stops at the first empty claim; retries in backoff wait
		// for the next run.
		if _, err := relay.Drain(ctx); err != nil {
			return relay.Counters(), err
		}
		return relay.Counters(), nil
	}
	log.Info("relaying to SNS; interrupt to stop", "endpoint", c.Endpoint, "region", c.Region)
	err = relay.Run(ctx)
	return relay.Counters(), err
}

// writeDemoOrders writes n orders, each with its order.created event in the
// same transaction, as a producer would.
func writeDemoOrders(ctx context.Context, db *sqlx.DB, box *sqlxoutbox.Outbox, n int) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS demo_orders (id TEXT PRIMARY KEY, total_cents INTEGER NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	for i := range n {
		id := fmt.Sprintf("o-%d-%d", time.Now().UnixNano(), i)
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO demo_orders (id, total_cents) VALUES ($1, $2)`, id, 1000+i); err != nil {
			tx.Rollback()
			return err
		}
		ev, err := core.NewEvent("order", id, "order.created", map[string]any{"order_id": id, "total_cents": 1000 + i})
		if err != nil {
			tx.Rollback()
			return err
		}
		ev.Headers = map[string]string{"source": "relay-sns-demo"}
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
