package gormoutbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/core"
)

// Invoice is a model that declares its events.
type Invoice struct {
	ID        int64 `gorm:"primaryKey"`
	Customer  string
	Cents     int64
	CreatedAt time.Time
}

// OutboxEvents emits invoice.created and invoice.voided; the generated ID
// is already set when the Plugin asks.
func (i *Invoice) OutboxEvents(op gormoutbox.Op) ([]core.Event, error) {
	var typ string
	switch op {
	case gormoutbox.Create:
		typ = "invoice.created"
	case gormoutbox.Delete:
		typ = "invoice.voided"
	default:
		return nil, nil
	}
	ev, err := core.NewEvent("invoice", strconv.FormatInt(i.ID, 10), typ, map[string]any{"id": i.ID, "cents": i.Cents})
	return []core.Event{ev}, err
}

// The Plugin writes a model's events in the transaction GORM writes the
// model in; the relay publishes them from the Store.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "gormoutbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sqlDB, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()
	db, err := gorm.Open(sqlite.New(sqlite.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Invoice{}); err != nil {
		log.Fatal(err)
	}
	if err := gormoutbox.AutoMigrate(db, gormoutbox.MigrateOptions{Logger: discardLogger()}); err != nil {
		log.Fatal(err)
	}
	if err := db.Use(gormoutbox.Plugin{}); err != nil {
		log.Fatal(err)
	}

	inv := Invoice{Customer: "acme", Cents: 4200}
	if err := db.Create(&inv).Error; err != nil { // the invoice and invoice.created
		log.Fatal(err)
	}
	_ = db.Transaction(func(tx *gorm.DB) error {
		tx.Create(&Invoice{Customer: "nobody", Cents: 1})
		return fmt.Errorf("changed my mind") // neither the invoice nor its event
	})
	if err := db.Delete(&inv).Error; err != nil { // invoice.voided
		log.Fatal(err)
	}

	store, err := gormoutbox.NewStore(db, gormoutbox.StoreOptions{Logger: discardLogger()})
	if err != nil {
		log.Fatal(err)
	}
	broker := core.PublisherFunc(func(ctx context.Context, evs []core.Event) error {
		for _, ev := range evs {
			fmt.Printf("%s %s %s\n", ev.EventType, ev.AggregateID, ev.Payload)
		}
		return nil
	})
	relay, err := core.NewRelay(store, broker, core.RelayOptions{Logger: discardLogger()})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.Drain(ctx); err != nil { // a service runs relay.Run(ctx)
		log.Fatal(err)
	}
	// Output:
	// invoice.created 1 {"cents":4200,"id":1}
	// invoice.voided 1 {"cents":4200,"id":1}
}
