package gormoutbox_test

import (
	"errors"
	"strings"
	"testing"

	"gorm.io/gorm"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/core"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// refusedOrder is an order row whose event is invalid on every database:
// its payload is not JSON.
type refusedOrder struct {
	ID      int64 `gorm:"primaryKey"`
	BuyerID string
	Total   int64
}

func (refusedOrder) TableName() string { return "orders" }

func (o *refusedOrder) OutboxEvents(gormoutbox.Op) ([]core.Event, error) {
	return []core.Event{{EventType: "order.created", Payload: []byte(`{"note":"a`)}}, nil
}

// The Plugin refuses an invalid event before the database sees it, and
// never commits its model without it.
func TestInvalidModelEventNeverCommitsTheModelAlone(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		bad := func() *refusedOrder { return &refusedOrder{BuyerID: "b", Total: 1} }

		// GORM's own transaction rolls back.
		err := e.db.Create(bad()).Error
		if !errors.Is(err, core.ErrInvalidEvent) || !errors.Is(err, gormoutbox.ErrEvents) {
			t.Fatalf("Create with an invalid event: %v, want ErrInvalidEvent and ErrEvents", err)
		}
		if n := e.countOrders(t); n != 0 {
			t.Fatalf("%d orders committed without their event", n)
		}

		// A transaction of the caller's that ignores the error cannot
		// commit the order without its event: Commit refuses.
		var createErr error
		err = e.db.Transaction(func(tx *gorm.DB) error {
			createErr = tx.Create(bad()).Error
			return tx.Create(&order{BuyerID: "good", Total: 2}).Error
		})
		if !errors.Is(createErr, core.ErrInvalidEvent) || err == nil || !strings.Contains(err.Error(), "rolled back") {
			t.Fatalf("Create %v, Transaction %v; want the invalid event refused and the commit refused", createErr, err)
		}
		if n := e.countOrders(t); n != 0 {
			t.Fatalf("%d orders committed after a refused event", n)
		}

		// Undone by its savepoint (a nested db.Transaction that returned
		// the error), the refused order is gone, and the rest commits.
		err = e.db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Transaction(func(tx2 *gorm.DB) error { return tx2.Create(bad()).Error }); !errors.Is(err, core.ErrInvalidEvent) {
				t.Errorf("nested Create: %v", err)
			}
			return tx.Create(&order{BuyerID: "good", Total: 3}).Error
		})
		if err != nil {
			t.Fatalf("the transaction after the savepoint's rollback: %v", err)
		}
		if n, rows := e.countOrders(t), e.outboxRows(t); n != 1 || len(rows) != 1 {
			t.Fatalf("%d orders and %d events, want the good order and its event", n, len(rows))
		}

		// gormoutbox.Enqueue refuses before anything is written: the
		// caller's transaction goes on and commits its other writes.
		err = e.db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&plainOrder{BuyerID: "plain", Total: 4}).Error; err != nil {
				return err
			}
			if err := gormoutbox.Enqueue(tx, core.Event{EventType: "x\x00"}); !errors.Is(err, core.ErrInvalidEvent) {
				t.Errorf("Enqueue of an invalid event: %v", err)
			}
			return nil
		})
		if err != nil || e.countOrders(t) != 2 {
			t.Fatalf("commit after a refused Enqueue: %v, %d orders", err, e.countOrders(t))
		}
	})
}

// A producer's test reads what its transaction will write at the commit.
func TestPendingEventsForProducerTests(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		err := e.db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&order{BuyerID: "b-42", Total: 7}).Error; err != nil {
				return err
			}
			ev := outboxtest.RequireEnqueued(t, gormoutbox.PendingEvents(tx), "order.create", nil)
			if ev.Headers["op"] != "create" {
				t.Errorf("pending event %+v", ev)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := gormoutbox.PendingEvents(e.db); got != nil {
			t.Fatalf("PendingEvents outside a transaction = %v", got)
		}
	})
}
