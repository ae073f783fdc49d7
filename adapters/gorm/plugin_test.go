package gormoutbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"gorm.io/gorm"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/core"
)

func payloadOf(t *testing.T, s storedEvent) orderPayload {
	t.Helper()
	var p orderPayload
	if err := json.Unmarshal([]byte(s.Payload), &p); err != nil {
		t.Fatalf("payload %q: %v", s.Payload, err)
	}
	return p
}

func wantTypes(t *testing.T, got []storedEvent, want ...string) {
	t.Helper()
	var types []string
	for _, g := range got {
		types = append(types, g.EventType+"/"+g.AggregateID)
	}
	if fmt.Sprint(types) != fmt.Sprint(want) {
		t.Fatalf("outbox holds %v, want %v", types, want)
	}
}

func TestCreateWritesEventsWithGeneratedValues(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		o := order{BuyerID: "b1", Total: 1250}
		if err := e.db.Create(&o).Error; err != nil {
			t.Fatal(err)
		}
		if o.ID == 0 || o.CreatedAt.IsZero() {
			t.Fatalf("GORM did not set id/created_at: %+v", o)
		}
		rows := e.outboxRows(t)
		wantTypes(t, rows, "order.create/"+strconv.FormatInt(o.ID, 10))
		p := payloadOf(t, rows[0])
		if p.OrderID != o.ID || !p.CreatedAt.Equal(o.CreatedAt) || p.Total != 1250 || p.BuyerID != "b1" {
			t.Fatalf("payload %+v does not carry the generated id and created_at of %+v", p, o)
		}
		if rows[0].Headers == "" || !json.Valid([]byte(rows[0].Headers)) {
			t.Fatalf("headers %q", rows[0].Headers)
		}
		var h map[string]string
		if err := json.Unmarshal([]byte(rows[0].Headers), &h); err != nil || h["op"] != "create" {
			t.Fatalf("headers %q (%v), want op=create", rows[0].Headers, err)
		}
	})
}

func TestUpdateAndDeleteWriteEvents(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		o := order{BuyerID: "b1", Total: 10}
		if err := e.db.Create(&o).Error; err != nil {
			t.Fatal(err)
		}
		id := strconv.FormatInt(o.ID, 10)
		o.Status = "paid"
		if err := e.db.Save(&o).Error; err != nil {
			t.Fatal(err)
		}
		if err := e.db.Model(&o).Update("status", "shipped").Error; err != nil {
			t.Fatal(err)
		}
		if err := e.db.Model(&o).Updates(map[string]any{"total": 11}).Error; err != nil {
			t.Fatal(err)
		}
		if err := e.db.Delete(&o).Error; err != nil {
			t.Fatal(err)
		}
		rows := e.outboxRows(t)
		wantTypes(t, rows, "order.create/"+id, "order.update/"+id, "order.update/"+id, "order.update/"+id, "order.delete/"+id)
		if s := payloadOf(t, rows[2]).Status; s != "shipped" {
			t.Fatalf("event of Update carries status %q, want the new one", s)
		}
		// A write that touches no row emits nothing.
		gone := order{ID: o.ID}
		if err := e.db.Delete(&gone).Error; err != nil {
			t.Fatal(err)
		}
		if n := len(e.outboxRows(t)); n != 5 {
			t.Fatalf("delete of a missing row emitted events: %d rows", n)
		}
	})
}

func TestUserTransactionCommitsModelsAndEvents(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		var a, b order
		err := e.db.Transaction(func(tx *gorm.DB) error {
			a = order{BuyerID: "a"}
			if err := tx.Create(&a).Error; err != nil {
				return err
			}
			b = order{BuyerID: "b"}
			if err := tx.Create(&b).Error; err != nil {
				return err
			}
			ev, err := core.NewEvent("order", strconv.FormatInt(a.ID, 10), "order.noted", map[string]int{"n": 1})
			if err != nil {
				return err
			}
			return gormoutbox.Enqueue(tx, ev)
		})
		if err != nil {
			t.Fatal(err)
		}
		ia, ib := strconv.FormatInt(a.ID, 10), strconv.FormatInt(b.ID, 10)
		wantTypes(t, e.outboxRows(t), "order.create/"+ia, "order.create/"+ib, "order.noted/"+ia)
	})
}

func TestRollbackLeavesNeitherModelNorEvents(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		errAbort := errors.New("abort")
		err := e.db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&order{BuyerID: "x"}).Error; err != nil {
				return err
			}
			if err := tx.Create(&[]order{{BuyerID: "y"}, {BuyerID: "z"}}).Error; err != nil {
				return err
			}
			return errAbort
		})
		if !errors.Is(err, errAbort) {
			t.Fatalf("Transaction: %v", err)
		}
		// A manual transaction rolled back.
		tx := e.db.Begin()
		if err := tx.Create(&order{BuyerID: "m"}).Error; err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback().Error; err != nil {
			t.Fatal(err)
		}
		if n, rows := e.countOrders(t), e.outboxRows(t); n != 0 || len(rows) != 0 {
			t.Fatalf("after rollback: %d orders, events %v", n, rows)
		}
	})
}

func TestFailureMidTransactionDropsEarlierEvents(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		err := e.db.Transaction(func(tx *gorm.DB) error {
			first := order{BuyerID: "first"}
			if err := tx.Create(&first).Error; err != nil {
				return err
			}
			// A later statement fails: the same primary key again.
			return tx.Create(&order{ID: first.ID, BuyerID: "dup"}).Error
		})
		if err == nil {
			t.Fatal("duplicate primary key did not fail")
		}
		if n, rows := e.countOrders(t), e.outboxRows(t); n != 0 || len(rows) != 0 {
			t.Fatalf("after a failed transaction: %d orders, events %v", n, rows)
		}
	})
}

func TestOutboxWriteFailureFailsTheCall(t *testing.T) {
	// The outbox table does not exist: the INSERT before COMMIT fails.
	forEach(t, &gormoutbox.Plugin{Table: "no_such_outbox"}, func(t *testing.T, e *env) {
		if err := e.db.Create(&order{BuyerID: "x"}).Error; err == nil {
			t.Fatal("Create succeeded without its events")
		}
		err := e.db.Transaction(func(tx *gorm.DB) error {
			return tx.Create(&order{BuyerID: "y"}).Error
		})
		if err == nil {
			t.Fatal("Transaction committed without its events")
		}
		if err := e.db.Session(&gorm.Session{SkipDefaultTransaction: true}).Create(&order{BuyerID: "z"}).Error; err == nil {
			t.Fatal("SkipDefaultTransaction Create succeeded without its events")
		}
		if n := e.countOrders(t); n != 0 {
			t.Fatalf("%d orders committed without their events", n)
		}
	})
}

func TestModelEventsErrorFailsTheCall(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		err := e.db.Create(&order{BuyerID: "x", failEvents: true}).Error
		if !errors.Is(err, gormoutbox.ErrEvents) || !errors.Is(err, errModelEvents) {
			t.Fatalf("Create: %v, want ErrEvents wrapping the model's error", err)
		}
		if n := e.countOrders(t); n != 0 {
			t.Fatalf("%d orders committed although their events failed", n)
		}
	})
}

func TestBatchCreate(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		orders := make([]order, 30)
		for i := range orders {
			orders[i].BuyerID = fmt.Sprintf("b%d", i)
		}
		if err := e.db.Create(&orders).Error; err != nil {
			t.Fatal(err)
		}
		ptrs := []*order{{BuyerID: "p1"}, {BuyerID: "p2"}}
		if err := e.db.CreateInBatches(ptrs, 1).Error; err != nil {
			t.Fatal(err)
		}
		rows := e.outboxRows(t)
		if len(rows) != 32 {
			t.Fatalf("%d events for 32 orders", len(rows))
		}
		for i, o := range append(orders, *ptrs[0], *ptrs[1]) {
			if p := payloadOf(t, rows[i]); p.OrderID != o.ID || p.OrderID == 0 || p.BuyerID != o.BuyerID {
				t.Fatalf("event %d: %+v, want order %+v", i, p, o)
			}
		}
	})
}

func TestSkipDefaultTransactionStillAtomic(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		s := e.db.Session(&gorm.Session{SkipDefaultTransaction: true})
		o := order{BuyerID: "s"}
		if err := s.Create(&o).Error; err != nil {
			t.Fatal(err)
		}
		wantTypes(t, e.outboxRows(t), "order.create/"+strconv.FormatInt(o.ID, 10))
		// The statement ran in a transaction the Plugin opened: failing
		// events roll the row back.
		if err := s.Create(&order{BuyerID: "f", failEvents: true}).Error; !errors.Is(err, errModelEvents) {
			t.Fatalf("Create: %v", err)
		}
		if n := e.countOrders(t); n != 1 {
			t.Fatalf("%d orders, want 1: the failed one was kept", n)
		}
		// Models without events still run without a transaction.
		before := e.stmts.Load()
		if err := s.Create(&plainOrder{BuyerID: "plain"}).Error; err != nil {
			t.Fatal(err)
		}
		if n := e.stmts.Load() - before; n != 1 {
			t.Fatalf("plain create took %d statements", n)
		}
	})
}

func TestNestedTransactionRollbackDropsItsEvents(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		var kept, kept2 order
		errInner := errors.New("inner fails")
		err := e.db.Transaction(func(tx *gorm.DB) error {
			kept = order{BuyerID: "outer"}
			if err := tx.Create(&kept).Error; err != nil {
				return err
			}
			if err := tx.Transaction(func(tx2 *gorm.DB) error {
				if err := tx2.Create(&order{BuyerID: "inner"}).Error; err != nil {
					return err
				}
				return tx2.Transaction(func(tx3 *gorm.DB) error {
					return tx3.Create(&order{BuyerID: "innermost"}).Error
				})
				// falls through to errInner below
			}); err != nil {
				return err
			}
			if err := tx.Transaction(func(tx2 *gorm.DB) error {
				if err := tx2.Create(&order{BuyerID: "inner2"}).Error; err != nil {
					return err
				}
				return errInner
			}); !errors.Is(err, errInner) {
				return fmt.Errorf("inner transaction: %v", err)
			}
			kept2 = order{BuyerID: "outer2"}
			return tx.Create(&kept2).Error
		})
		if err != nil {
			t.Fatal(err)
		}
		var buyers []string
		if err := e.db.Model(&order{}).Order("id").Pluck("buyer_id", &buyers).Error; err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(buyers) != "[outer inner innermost outer2]" {
			t.Fatalf("orders %v", buyers)
		}
		rows := e.outboxRows(t)
		var got []string
		for _, r := range rows {
			got = append(got, payloadOf(t, r).BuyerID)
		}
		if fmt.Sprint(got) != fmt.Sprint(buyers) {
			t.Fatalf("events of %v, orders %v", got, buyers)
		}
	})
}

func TestConcurrentCreates(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		const workers, each = 8, 25
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					o := order{BuyerID: fmt.Sprintf("w%d-%d", w, i), Total: int64(i)}
					var err error
					if i%2 == 0 {
						err = e.db.Create(&o).Error
					} else {
						err = e.db.Transaction(func(tx *gorm.DB) error { return tx.Create(&o).Error })
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		var orders []order
		if err := e.db.Order("id").Find(&orders).Error; err != nil {
			t.Fatal(err)
		}
		rows := e.outboxRows(t)
		if len(orders) != workers*each || len(rows) != workers*each {
			t.Fatalf("%d orders, %d events, want %d each", len(orders), len(rows), workers*each)
		}
		byID := map[int64]int{}
		for _, r := range rows {
			p := payloadOf(t, r)
			byID[p.OrderID]++
			if r.AggregateID != strconv.FormatInt(p.OrderID, 10) {
				t.Fatalf("event of order %d has aggregate %s", p.OrderID, r.AggregateID)
			}
		}
		for _, o := range orders {
			if byID[o.ID] != 1 {
				t.Fatalf("order %d has %d events", o.ID, byID[o.ID])
			}
		}
	})
}

func TestEnqueue(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		ev := core.Event{EventType: "x.happened", AggregateID: "7"}
		if err := gormoutbox.Enqueue(e.db, ev); !errors.Is(err, core.ErrNoTransaction) {
			t.Fatalf("Enqueue outside a transaction: %v", err)
		}
		err := e.db.Transaction(func(tx *gorm.DB) error {
			return gormoutbox.Enqueue(tx, core.Event{AggregateID: "1"})
		})
		if !errors.Is(err, core.ErrInvalidEvent) {
			t.Fatalf("Enqueue of an event without a type: %v", err)
		}
		evs := []core.Event{{EventType: "x.one", AggregateID: "1"}, {EventType: "x.two", AggregateID: "2"}}
		if err := e.db.Transaction(func(tx *gorm.DB) error { return gormoutbox.Enqueue(tx, evs...) }); err != nil {
			t.Fatal(err)
		}
		if evs[0].ID == "" || evs[1].ID == "" {
			t.Fatal("Enqueue did not set the event IDs in place")
		}
		// A transaction the Plugin does not manage (on a dedicated
		// connection) gets its events written at once.
		err = e.db.Connection(func(c *gorm.DB) error {
			return c.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&order{BuyerID: "conn"}).Error; err != nil {
					return err
				}
				return gormoutbox.Enqueue(tx, core.Event{EventType: "x.three", AggregateID: "3"})
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		rows := e.outboxRows(t)
		if len(rows) != 4 || rows[0].EventType != "x.one" || rows[1].EventType != "x.two" || rows[3].EventType != "x.three" {
			t.Fatalf("outbox %v", rows)
		}
	})
}

func TestHookErrorFailsTheCall(t *testing.T) {
	errHook := errors.New("hook refuses")
	hooks := []core.EnqueueHook{func(ctx context.Context, ev *core.Event) error {
		if ctx == nil {
			return errors.New("no context")
		}
		if ev.AggregateID == "" || ev.ID == "" {
			return errors.New("hook ran before Prepare")
		}
		if payloadOfEvent(ev).BuyerID == "refuse" {
			return errHook
		}
		ev.Headers["hooked"] = "yes"
		return nil
	}}
	forEach(t, &gormoutbox.Plugin{Hooks: hooks}, func(t *testing.T, e *env) {
		if err := e.db.Create(&order{BuyerID: "refuse"}).Error; !errors.Is(err, errHook) {
			t.Fatalf("Create: %v, want the hook's error", err)
		}
		if err := e.db.Create(&order{BuyerID: "ok"}).Error; err != nil {
			t.Fatal(err)
		}
		rows := e.outboxRows(t)
		if n := e.countOrders(t); n != 1 || len(rows) != 1 {
			t.Fatalf("%d orders, %d events", n, len(rows))
		}
		var h map[string]string
		if err := json.Unmarshal([]byte(rows[0].Headers), &h); err != nil || h["hooked"] != "yes" {
			t.Fatalf("headers %q: the hook's change was not written", rows[0].Headers)
		}
	})
}

func payloadOfEvent(ev *core.Event) orderPayload {
	var p orderPayload
	_ = json.Unmarshal(ev.Payload, &p)
	return p
}

func TestNotifierAfterCommitOnly(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			var n atomic.Int64
			var atNotify []int
			var e *env
			notifier := core.NotifierFunc(func() {
				n.Add(1)
				// The notified relay must find the events committed.
				atNotify = append(atNotify, len(e.outboxRows(t)))
			})
			e = newEnv(t, b, &gormoutbox.Plugin{Notifier: notifier}, nil)
			if err := e.db.Create(&order{BuyerID: "a"}).Error; err != nil {
				t.Fatal(err)
			}
			_ = e.db.Transaction(func(tx *gorm.DB) error {
				tx.Create(&order{BuyerID: "rolled back"})
				return errors.New("abort")
			})
			if err := e.db.Create(&plainOrder{BuyerID: "no events"}).Error; err != nil {
				t.Fatal(err)
			}
			if err := e.db.Transaction(func(tx *gorm.DB) error {
				return tx.Create(&[]order{{BuyerID: "b"}, {BuyerID: "c"}}).Error
			}); err != nil {
				t.Fatal(err)
			}
			if n.Load() != 2 || fmt.Sprint(atNotify) != "[1 3]" {
				t.Fatalf("notified %d times, seeing %v events; want 2 times, after each commit [1 3]", n.Load(), atNotify)
			}
		})
	}
}

func TestPreparedStatementMode(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b, &gormoutbox.Plugin{}, &gorm.Config{PrepareStmt: true})
			for i := range 3 {
				if err := e.db.Create(&order{BuyerID: "p" + strconv.Itoa(i)}).Error; err != nil {
					t.Fatal(err)
				}
			}
			err := e.db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&order{BuyerID: "t"}).Error; err != nil {
					return err
				}
				return tx.Transaction(func(tx2 *gorm.DB) error {
					if err := tx2.Create(&order{BuyerID: "nested"}).Error; err != nil {
						return err
					}
					return errors.New("roll back nested")
				})
			})
			if err == nil {
				t.Fatal("want the nested error")
			}
			if err := e.db.Session(&gorm.Session{PrepareStmt: true}).Transaction(func(tx *gorm.DB) error {
				return tx.Create(&order{BuyerID: "s"}).Error
			}); err != nil {
				t.Fatal(err)
			}
			if n, rows := e.countOrders(t), e.outboxRows(t); n != 4 || len(rows) != 4 {
				t.Fatalf("%d orders, %d events; want 4 each", n, len(rows))
			}
		})
	}
}

func TestManualBeginCommit(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		tx := e.db.Begin()
		o := order{BuyerID: "manual"}
		if err := tx.Create(&o).Error; err != nil {
			t.Fatal(err)
		}
		// Not yet committed: nothing is visible outside the transaction.
		if n := len(e.outboxRows(t)); n != 0 {
			t.Fatalf("%d events visible before commit", n)
		}
		if err := tx.Commit().Error; err != nil {
			t.Fatal(err)
		}
		wantTypes(t, e.outboxRows(t), "order.create/"+strconv.FormatInt(o.ID, 10))
	})
}

// cart has line items that emit events of their own: GORM creates them in
// the cart's transaction, through the same callbacks.
type cart struct {
	ID    int64 `gorm:"primaryKey"`
	Items []lineItem
}

type lineItem struct {
	ID     int64 `gorm:"primaryKey"`
	CartID int64
	SKU    string
}

func (c *cart) OutboxEvents(op gormoutbox.Op) ([]core.Event, error) {
	return []core.Event{{EventType: "cart." + op.String(), AggregateID: strconv.FormatInt(c.ID, 10)}}, nil
}

func (i *lineItem) OutboxEvents(op gormoutbox.Op) ([]core.Event, error) {
	return []core.Event{{EventType: "item." + op.String(), AggregateID: i.SKU + "@" + strconv.FormatInt(i.CartID, 10)}}, nil
}

func TestAssociationsEmitInTheSameTransaction(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		if err := e.db.AutoMigrate(&cart{}, &lineItem{}); err != nil {
			t.Fatal(err)
		}
		c := cart{Items: []lineItem{{SKU: "a"}, {SKU: "b"}}}
		before := e.stmts.Load()
		if err := e.db.Create(&c).Error; err != nil {
			t.Fatal(err)
		}
		// cart INSERT, items INSERT, one outbox INSERT.
		if n := e.stmts.Load() - before; n != 3 {
			t.Errorf("%d statements, want 3", n)
		}
		id := strconv.FormatInt(c.ID, 10)
		wantTypes(t, e.outboxRows(t), "item.create/a@"+id, "item.create/b@"+id, "cart.create/"+id)
	})
}

// ticket is soft-deleted: GORM's Delete is an UPDATE of deleted_at.
type ticket struct {
	ID        int64 `gorm:"primaryKey"`
	Title     string
	DeletedAt gorm.DeletedAt
}

func (k *ticket) OutboxEvents(op gormoutbox.Op) ([]core.Event, error) {
	return []core.Event{{EventType: "ticket." + op.String(), AggregateID: strconv.FormatInt(k.ID, 10)}}, nil
}

func TestSoftDeleteAndSaveUpsert(t *testing.T) {
	forEach(t, nil, func(t *testing.T, e *env) {
		if err := e.db.AutoMigrate(&ticket{}); err != nil {
			t.Fatal(err)
		}
		k := ticket{Title: "a"}
		if err := e.db.Create(&k).Error; err != nil {
			t.Fatal(err)
		}
		if err := e.db.Delete(&k).Error; err != nil {
			t.Fatal(err)
		}
		// Save of a primary key that does not exist yet: GORM's UPDATE
		// touches no row (no event), then it INSERTs (a create event).
		fresh := ticket{ID: 500, Title: "upserted"}
		if err := e.db.Save(&fresh).Error; err != nil {
			t.Fatal(err)
		}
		id := strconv.FormatInt(k.ID, 10)
		wantTypes(t, e.outboxRows(t), "ticket.create/"+id, "ticket.delete/"+id, "ticket.create/500")
	})
}
