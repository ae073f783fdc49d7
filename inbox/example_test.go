package inbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
)

// An inventory consumer on SQLite and the in-process GoChannel: the same
// order.created event arrives three times (the relay retried, the broker
// redelivered), and the stock is decremented once.
func ExampleNewMiddleware() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "inventory.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	quiet := slog.New(slog.DiscardHandler)

	// The inbox table comes from the shared migrations; stock is the
	// consumer's own table.
	if err := dialect.Migrate(ctx, db, dialect.SQLite, dialect.MigrateOptions{SkipOutbox: true, Logger: quiet}); err != nil {
		panic(err)
	}
	if _, err := db.Exec(`CREATE TABLE stock (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL); INSERT INTO stock VALUES ('sku-1', 10)`); err != nil {
		panic(err)
	}

	ib, err := sqlinbox.New(db, sqlinbox.Options{})
	if err != nil {
		panic(err)
	}
	mw, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: "inventory", Logger: quiet})
	if err != nil {
		panic(err)
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(mw)
	router.AddConsumerHandler("decrement-stock", "order.created", pubSub, func(msg *message.Message) error {
		var order struct {
			SKU string `json:"sku"`
			Qty int    `json:"qty"`
		}
		if err := json.Unmarshal(msg.Payload, &order); err != nil {
			return err
		}
		// The write goes through the inbox's transaction: it commits with
		// the record of the event, or not at all.
		_, err := sqlinbox.Tx(msg.Context()).ExecContext(msg.Context(),
			`UPDATE stock SET qty = qty - ? WHERE sku = ?`, order.Qty, order.SKU)
		return err
	})
	rctx, stop := context.WithCancel(ctx)
	go func() { _ = router.Run(rctx) }()
	<-router.Running()

	ev, _ := core.NewEvent("order", "o-1", "order.created", map[string]any{"sku": "sku-1", "qty": 3})
	ev.ID = "0193a5f0-0000-7000-8000-000000000001"
	for range 3 {
		// Publish returns once the handler acked the delivery.
		if err := pubSub.Publish("order.created", watermillbroker.NewMessage(ctx, &ev)); err != nil {
			panic(err)
		}
	}
	stop()
	waitClosed(router)

	var qty int
	_ = db.QueryRow(`SELECT qty FROM stock WHERE sku = 'sku-1'`).Scan(&qty)
	processed, _ := ib.Processed(ctx, "inventory", ev.ID)
	fmt.Println("stock of sku-1:", qty)
	fmt.Println("event recorded:", processed)
	// Output:
	// stock of sku-1: 7
	// event recorded: true
}

func waitClosed(r *message.Router) {
	deadline := time.Now().Add(10 * time.Second)
	for !r.IsClosed() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}
