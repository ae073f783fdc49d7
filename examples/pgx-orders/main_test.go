package main

import (
	"go/build"
	"slices"
	"testing"

	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// The example, run: the order's event reaches RabbitMQ and the inbox on
// pgx takes stock once, absorbing the redelivery.
func TestPgxOrders(t *testing.T) {
	t.Parallel()
	res, err := run(t.Context(), testenv.PostgresDSN(t), testenv.AMQPURL(t), "pgx-orders-"+testenv.RandomSuffix())
	if err != nil {
		t.Fatal(err)
	}
	if res.stock != 99 || res.duplicates != 1 || res.eventID == "" {
		t.Fatalf("%+v: want the stock taken once and the redelivery absorbed", res)
	}
}

// A pgx service needs no database/sql: the example does not import it.
func TestNoDatabaseSQL(t *testing.T) {
	t.Parallel()
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(pkg.Imports, "database/sql") {
		t.Fatal("the pgx example imports database/sql")
	}
}
