package gormfixtures

import (
	"context"
	"errors"
	"testing"

	"gorm.io/gorm"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	outboxtest "github.com/txoutbox/txoutbox/testing"
	"github.com/txoutbox/txoutbox/testing/sqlfixture"
)

// Order is the business row of the suite's GORM producer: a model that
// emits the suite's events, so that every event the suite checks went
// through the Plugin's callbacks.
type Order struct {
	ID     int64 `gorm:"primaryKey"`
	Events int
	events []core.Event
}

// OutboxEvents implements gormoutbox.EventSource.
func (o *Order) OutboxEvents(op gormoutbox.Op) ([]core.Event, error) {
	if op != gormoutbox.Create {
		return nil, nil
	}
	return o.events, nil
}

var errRollback = errors.New("gormfixtures: roll back")

// Store is the outboxtest fixture of the GORM store on db (dialect d),
// whose outbox table exists and whose Plugin is installed: Enqueue writes
// an Order whose events the Plugin writes in db.Transaction;
// EnqueueThenCommit writes an Order without events and calls
// gormoutbox.Enqueue in the same transaction; the rest is sqlfixture's.
func Store(t testing.TB, db *gorm.DB, d dialect.Dialect) *outboxtest.StoreFixture {
	t.Helper()
	if err := db.AutoMigrate(&Order{}); err != nil {
		t.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	f := sqlfixture.Attach(t, sqlDB, d, sqlfixture.Options{})
	store, err := gormoutbox.NewStore(db, gormoutbox.StoreOptions{ClaimLease: f.ClaimLease})
	if err != nil {
		t.Fatal(err)
	}
	sf := f.StoreFixture(store)
	sf.Enqueue = func(ctx context.Context, evs []core.Event, commit bool) error {
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&Order{Events: len(evs), events: evs}).Error; err != nil {
				return err
			}
			if !commit {
				return errRollback
			}
			return nil
		})
		if !commit && errors.Is(err, errRollback) {
			return nil
		}
		return err
	}
	sf.EnqueueThenCommit = func(ctx context.Context, evs []core.Event) (enqueueErr, commitErr error) {
		commitErr = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&Order{Events: len(evs)}).Error; err != nil {
				return err
			}
			enqueueErr = gormoutbox.Enqueue(tx, evs...)
			return nil
		})
		return enqueueErr, commitErr
	}
	return sf
}
