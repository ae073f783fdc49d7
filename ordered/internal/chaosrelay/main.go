// Command chaosrelay is one ordered relay process of the chaos test
// (TestOutageChaosOrdered): PostgreSQL outbox, partition leaser, RabbitMQ
// publisher behind a fault injector. The test starts several, kills them
// with SIGKILL and restarts them. It prints one line per lease change on
// stdout ("lease <kind> <partition> <from>") and logs to stderr; SIGTERM
// stops it cleanly.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/ordered"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

func env(name string) string {
	v := os.Getenv(name)
	if v == "" {
		fmt.Fprintf(os.Stderr, "chaosrelay: %s is not set\n", name)
		os.Exit(2)
	}
	return v
}

func envInt(name string) int {
	n, err := strconv.Atoi(env(name))
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaosrelay: %s: %v\n", name, err)
		os.Exit(2)
	}
	return n
}

func envFloat(name string) float64 {
	f, err := strconv.ParseFloat(env(name), 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaosrelay: %s: %v\n", name, err)
		os.Exit(2)
	}
	return f
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "chaosrelay:", err)
		os.Exit(1)
	}
}

func run() error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	owner := env("CHAOS_OWNER")
	log = log.With("relay", owner)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	db, err := sql.Open("pgx", env("CHAOS_PG_DSN"))
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(8)

	// watermill-amqp directly, through core.NewWatermillPublisher: durable
	// fanout exchange per topic, persistent messages, publisher confirms.
	cfg := amqpConfig(env("CHAOS_AMQP_URL"), env("CHAOS_CONSUMER"))
	cfg.Publish.ConfirmDelivery = true
	cfg.Publish.ChannelPoolSize = publishConcurrency
	wpub, err := wamqp.NewPublisher(cfg, watermill.NewSlogLogger(log.With("component", "amqp")))
	if err != nil {
		return err
	}
	defer wpub.Close()
	pub := byAggregate{inner: core.NewWatermillPublisher(wpub, nil), conc: publishConcurrency}
	faulty := &outboxtest.Faulty{Inner: pub, FailRate: envFloat("CHAOS_FAIL_RATE"), FailAfterSendRate: envFloat("CHAOS_FAIL_AFTER_SEND_RATE")}

	var outMu sync.Mutex
	ttl := time.Duration(envInt("CHAOS_LEASE_TTL_MS")) * time.Millisecond
	leaser, err := ordered.NewLeaser(db, dialect.Postgres, ordered.LeaserOptions{
		Owner:          owner,
		PartitionCount: envInt("CHAOS_PARTITIONS"),
		LeaseTTL:       ttl,
		Logger:         log,
		OnChange: func(c ordered.LeaseChange) {
			outMu.Lock()
			defer outMu.Unlock()
			from := c.From
			if from == "" {
				from = "-"
			}
			fmt.Printf("lease %s %d %s\n", c.Kind, c.Partition, from)
		},
	})
	if err != nil {
		return err
	}
	store, err := ordered.NewStore(db, dialect.Postgres, ordered.StoreOptions{Logger: log})
	if err != nil {
		return err
	}
	relay, err := core.NewRelay(store, faulty, core.RelayOptions{
		BatchSize:    envInt("CHAOS_BATCH"),
		Concurrency:  2,
		PollInterval: 20 * time.Millisecond,
		Retry: core.RetryPolicy{
			InitialBackoff: 20 * time.Millisecond,
			MaxBackoff:     250 * time.Millisecond,
			MaxAttempts:    1_000_000, // nothing may go dead: dead would be lost
		},
		Ordering: core.OrderingOn,
		Ordered:  core.OrderedOptions{Leaser: leaser},
		// Warnings of every injected failure would drown the log.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})).With("relay", owner),
	})
	if err != nil {
		return err
	}
	log.Info("chaosrelay: running")
	err = relay.Run(ctx)
	c := relay.Counters()
	log.Info("chaosrelay: stopped", "published", c.Published, "failed", c.Failed, "faults", fmt.Sprintf("%+v", faulty.Counts()))
	return err
}

// publishConcurrency is how many aggregates one Publish sends at once.
const publishConcurrency = 32

// amqpConfig is the watermill-amqp topology of the chaos test: a durable
// fanout exchange per topic and one durable queue per consumer and topic
// (consumer.topic), which the test declares before the relays start.
func amqpConfig(url, consumer string) wamqp.Config {
	cfg := wamqp.NewDurablePubSubConfig(url, func(topic string) string { return consumer + "." + topic })
	cfg.Connection.Reconnect = &wamqp.ReconnectConfig{
		BackoffInitialInterval:     100 * time.Millisecond,
		BackoffRandomizationFactor: 0.5,
		BackoffMultiplier:          1.5,
		BackoffMaxInterval:         500 * time.Millisecond,
	}
	return cfg
}

// byAggregate publishes the events of different aggregates in parallel,
// one aggregate's events one after another, and none of an aggregate's
// events after one of them failed.
type byAggregate struct {
	inner core.Publisher
	conc  int
}

func (p byAggregate) Publish(ctx context.Context, events []core.Event) error {
	var groups [][]int
	byAgg := map[string]int{}
	for i := range events {
		g, ok := byAgg[events[i].AggregateID]
		if !ok || events[i].AggregateID == "" {
			g = len(groups)
			byAgg[events[i].AggregateID] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	be := core.NewBatchError(len(events))
	sem := make(chan struct{}, p.conc)
	var wg sync.WaitGroup
	for _, g := range groups {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			var failed error
			for _, i := range g {
				if failed != nil {
					be.Errs[i] = fmt.Errorf("not sent after an earlier failure: %w", failed)
					continue
				}
				if err := p.inner.Publish(ctx, events[i:i+1]); err != nil {
					be.Errs[i], failed = err, err
				}
			}
		}()
	}
	wg.Wait()
	return be.ErrOrNil()
}
