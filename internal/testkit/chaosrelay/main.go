// Command chaosrelay is one ordered relay process of the chaos tests
// (TestOutageChaosOrdered, TestOutageChaosLog): PostgreSQL outbox,
// partition leaser, RabbitMQ publisher (brokers/amqp, confirms) behind a
// fault injector; with CHAOS_MODE=log, a log-mode relay on the slot
// CHAOS_SLOT. The test starts several, kills them with SIGKILL and
// restarts them. It prints one line per lease change on stdout ("lease
// <kind> <partition> <from>"), in log mode "stream on" and "stream off"
// when it starts and stops streaming the slot, and logs to stderr; SIGTERM
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

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/logmode"
	"github.com/txoutbox/txoutbox/logrelay"
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

	d, err := dialect.ByName(env("CHAOS_DIALECT"))
	if err != nil {
		return err
	}
	driver := "pgx"
	if d == dialect.MySQL {
		driver = "mysql"
	}
	db, err := sql.Open(driver, env("CHAOS_DSN"))
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(8)

	pub, err := amqpbroker.NewPublisher(amqpbroker.Options{
		URL:       env("CHAOS_AMQP_URL"),
		Consumers: []string{env("CHAOS_CONSUMER")},
		Channels:  4,
		Reconnect: amqpbroker.Reconnect{Min: 100 * time.Millisecond, Max: 500 * time.Millisecond},
		Logger:    log,
	})
	if err != nil {
		return err
	}
	defer pub.Close()
	faulty := &outboxtest.Faulty{Inner: pub, FailRate: envFloat("CHAOS_FAIL_RATE"), FailAfterSendRate: envFloat("CHAOS_FAIL_AFTER_SEND_RATE")}

	var outMu sync.Mutex
	ttl := time.Duration(envInt("CHAOS_LEASE_TTL_MS")) * time.Millisecond
	leaser, err := ordered.NewLeaser(db, d, ordered.LeaserOptions{
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
	store, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Dialect: d, Logger: log})
	if err != nil {
		return err
	}
	ropts := core.RelayOptions{
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
	}
	if os.Getenv("CHAOS_MODE") == "log" {
		ropts.Logger = log // the stream logs its state changes once each
		slot := env("CHAOS_SLOT")
		lr, err := logrelay.New(store, faulty, logrelay.Options{
			ConnString: env("CHAOS_DSN"),
			Names:      logrelay.Names{Slot: slot, Publication: slot},
			Options:    logmode.Options{Relay: ropts},
		})
		if err != nil {
			return err
		}
		go func() {
			streaming := false
			for ctx.Err() == nil {
				if s := lr.Streaming(); s != streaming {
					streaming = s
					outMu.Lock()
					fmt.Println(map[bool]string{true: "stream on", false: "stream off"}[s])
					outMu.Unlock()
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		log.Info("chaosrelay: running in log mode")
		err = lr.Run(ctx)
		c := lr.Counters()
		log.Info("chaosrelay: stopped", "published", c.Published, "failed", c.Failed, "held", c.Held, "faults", fmt.Sprintf("%+v", faulty.Counts()))
		return err
	}
	relay, err := core.NewRelay(store, faulty, ropts)
	if err != nil {
		return err
	}
	log.Info("chaosrelay: running")
	err = relay.Run(ctx)
	c := relay.Counters()
	log.Info("chaosrelay: stopped", "published", c.Published, "failed", c.Failed, "faults", fmt.Sprintf("%+v", faulty.Counts()))
	return err
}
