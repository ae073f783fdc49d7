// Command faultconsumer is the consumer process of the fault matrix's
// "consumer SIGKILL" cells: it subscribes to FC_TOPIC on FC_BROKER
// (amqp://..., kafka://host:port,... or nats://host:port?stream=NAME) as the
// group FC_GROUP, or with
// FC_BROKER=sqs reads the goaws SQS queue FC_SQS_QUEUE at FC_SQS_ENDPOINT
// (subscribed to the SNS topic, raw), and applies every event through the
// SQL inbox on FC_DSN (PostgreSQL) as the consumer
// FC_CONSUMER, writing a row into the effects table in the inbox's
// transaction, as the suite's in-process consumer does. It prints "ready"
// once subscribed and "delivered <event ID>" as each message arrives, before
// it is applied; SIGTERM stops it, the test's SIGKILL kills it anywhere.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	natsbroker "github.com/txoutbox/txoutbox/brokers/nats"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/sqstest"
)

func env(name string) string {
	v := os.Getenv(name)
	if v == "" {
		fmt.Fprintf(os.Stderr, "faultconsumer: %s is not set\n", name)
		os.Exit(2)
	}
	return v
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "faultconsumer: %v\n", err)
		os.Exit(1)
	}
}

// out serialises the lines the test reads.
var out sync.Mutex

func say(format string, args ...any) {
	out.Lock()
	defer out.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	db, err := sqlx.Open("pgx", env("FC_DSN"))
	if err != nil {
		return err
	}
	defer db.Close()
	ib, err := sqlinbox.New(db, sqlinbox.Options{})
	if err != nil {
		return err
	}
	sub, err := subscriber(env("FC_BROKER"), log)
	if err != nil {
		return err
	}
	mw, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: env("FC_CONSUMER"), Logger: log})
	if err != nil {
		return err
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			say("delivered %s", msg.Metadata.Get(core.HeaderEventID))
			return h(msg)
		}
	}, mw)
	r.AddConsumerHandler("effects", env("FC_TOPIC"), sub, func(msg *message.Message) error {
		tx := sqlinbox.Txx(msg.Context())
		if tx == nil {
			return errors.New("no *sqlx.Tx in the handler's context")
		}
		_, err := tx.ExecContext(msg.Context(), tx.Rebind(`INSERT INTO effects (effect_key) VALUES (?)`), msg.Metadata.Get(core.HeaderEventID))
		return err
	})
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case <-r.Running():
		say("ready")
	case err := <-done:
		return fmt.Errorf("router: %w", err)
	}
	return <-done
}

func subscriber(broker string, log *slog.Logger) (message.Subscriber, error) {
	if broker == "sqs" {
		endpoint := env("FC_SQS_ENDPOINT")
		g := &sqstest.Goaws{Endpoint: endpoint, SQS: sqstest.NewClient(endpoint)}
		return &sqstest.Subscriber{T: processTB{log}, G: g, Raw: true, QueueURL: env("FC_SQS_QUEUE")}, nil
	}
	group := env("FC_GROUP")
	if addrs, ok := strings.CutPrefix(broker, "kafka://"); ok {
		// A killed member's partitions go to its successor after the
		// session timeout: keep it short, as the matrix's consumers do.
		return kafkabroker.NewSubscriber(kafkabroker.SubscriberOptions{Brokers: strings.Split(addrs, ","), ConsumerGroup: group,
			Client: fixtures.KafkaGroupTimings(), Logger: log})
	}
	if strings.HasPrefix(broker, "nats://") {
		u, err := url.Parse(broker)
		if err != nil {
			return nil, err
		}
		stream := u.Query().Get("stream")
		u.RawQuery = ""
		// A killed consumer's message comes back soon.
		return natsbroker.NewSubscriber(natsbroker.SubscriberOptions{URL: u.String(), Stream: stream, Consumer: group, AckWait: 3 * time.Second, Logger: log})
	}
	return amqpbroker.NewSubscriber(amqpbroker.SubscriberOptions{URL: broker, Consumer: group, Logger: log})
}

// processTB reports the SQS subscriber's errors on stderr; a fatal one
// ends the process, which the test sees as a consumer that died.
type processTB struct{ log *slog.Logger }

func (processTB) Helper() {}

func (p processTB) Errorf(format string, args ...any) { p.log.Error(fmt.Sprintf(format, args...)) }

func (p processTB) Fatal(args ...any) {
	p.log.Error(fmt.Sprint(args...))
	os.Exit(1)
}

func (p processTB) Fatalf(format string, args ...any) {
	p.log.Error(fmt.Sprintf(format, args...))
	os.Exit(1)
}
