package ordered_test

import (
	"context"
	"database/sql"
	"log"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/ordered"
)

// An ordered relay on PostgreSQL that shares the outbox's partitions with the
// other relays of the table. Run as many as you like; each takes its fair
// share, and a dead one's partitions move to the others within LeaseTTL +
// RenewInterval.
func ExampleNewLeaser() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	// Once: the outbox, with the ordered claim's indexes and the lease
	// tables.
	if err := dialect.Migrate(ctx, db, dialect.Postgres, dialect.MigrateOptions{}); err != nil {
		log.Fatal(err)
	}
	// The store would build a leaser with the defaults by itself; build one
	// to name the owner or tune the lease.
	leaser, err := ordered.NewLeaser(db, dialect.Postgres, ordered.LeaserOptions{Owner: "relay-1", LeaseTTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	var publisher core.Publisher // e.g. an amqpbroker.Publisher
	relay, err := core.NewRelay(store, publisher, core.RelayOptions{
		Ordering: core.OrderingOn,
		Ordered:  core.OrderedOptions{Leaser: leaser, DeadLetter: core.DeadLetterBlock},
	})
	if err != nil {
		log.Fatal(err)
	}
	// Run runs the leaser too and releases the leases when ctx ends.
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
