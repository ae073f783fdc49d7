package pgnotify_test

import (
	"context"
	"os"
	"time"

	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/pgnotify"
)

// Producers in one process, the relay in another, woken by LISTEN/NOTIFY
// and polling every few seconds as the fallback.
func Example() {
	ctx := context.Background()
	dsn := os.Getenv("DATABASE_URL")
	db, err := sqlx.Open("pgx", dsn)
	if err != nil {
		panic(err)
	}

	// Producer process: Enqueue asks the Notifier, which NOTIFYs from its
	// own connection, at most once a millisecond.
	n, err := pgnotify.NewNotifier(dsn, pgnotify.NotifierOptions{})
	if err != nil {
		panic(err)
	}
	go n.Run(ctx)
	producer, err := sqlxoutbox.New(db, sqlxoutbox.Options{Notifier: n})
	if err != nil {
		panic(err)
	}
	_ = producer // producer.Enqueue(ctx, tx, events...) in the business transaction

	// Relay process: the Listener wakes the relay on every notification.
	store, err := sqlxoutbox.New(db, sqlxoutbox.Options{})
	if err != nil {
		panic(err)
	}
	var pub core.Publisher // a broker publisher, e.g. brokers/amqp
	relay, err := core.NewRelay(store, pub, core.RelayOptions{PollInterval: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	l, err := pgnotify.NewListener(dsn, relay, pgnotify.ListenerOptions{})
	if err != nil {
		panic(err)
	}
	go l.Run(ctx)
	_ = relay.Run(ctx)
}
