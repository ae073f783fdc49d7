package main

import (
	"io"
	"log/slog"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// The example relays its demo orders from a real PostgreSQL to the test
// RabbitMQ, into a consumer queue it declares.
func TestRunOnce(t *testing.T) {
	c := config{
		DSN: testenv.PostgresDSN(t), URL: testenv.AMQPURL(t),
		Exchange: "example." + testenv.RandomSuffix(), Consumers: "example-" + testenv.RandomSuffix(),
		Demo: 5, Once: true,
	}
	n, err := run(t.Context(), c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if n.Published != 5 || n.Failed != 0 {
		t.Fatalf("published %d, failed %d; want 5 and 0", n.Published, n.Failed)
	}
	conn, err := amqp.Dial(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := amqpbroker.QueueName(c.Consumers, "order.created")
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 5 {
		t.Errorf("queue %s holds %d messages, want 5", queue, q.Messages)
	}
	ch.QueueDelete(queue, false, false, false)
	ch.ExchangeDelete(c.Exchange, false, false)
}
