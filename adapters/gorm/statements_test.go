package gormoutbox_test

import (
	"testing"

	"gorm.io/gorm"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/core"
)

// TestAtMostOneExtraStatementPerTransaction counts the statements each
// write path sends to the database with the Plugin and without it (the same
// writes of models without events): the outbox adds exactly one, however
// many models, batches, nested transactions and Enqueue calls the
// transaction holds.
func TestAtMostOneExtraStatementPerTransaction(t *testing.T) {
	type path struct {
		name string
		run  func(db *gorm.DB, withEvents bool) error
	}
	newOrder := func(withEvents bool, buyer string) any {
		if withEvents {
			return &order{BuyerID: buyer}
		}
		return &plainOrder{BuyerID: buyer}
	}
	// created holds an order with events and one without, for the
	// update, save and delete paths. The subtests run one at a time.
	var created map[bool]any
	paths := []path{
		{"create", func(db *gorm.DB, ev bool) error { return db.Create(newOrder(ev, "a")).Error }},
		{"batch create of 200", func(db *gorm.DB, ev bool) error {
			if ev {
				os := make([]order, 200)
				return db.Create(&os).Error
			}
			os := make([]plainOrder, 200)
			return db.Create(&os).Error
		}},
		{"CreateInBatches of 200 by 50", func(db *gorm.DB, ev bool) error {
			if ev {
				os := make([]order, 200)
				return db.CreateInBatches(&os, 50).Error
			}
			os := make([]plainOrder, 200)
			return db.CreateInBatches(&os, 50).Error
		}},
		{"update", func(db *gorm.DB, ev bool) error { return db.Model(created[ev]).Update("status", "paid").Error }},
		{"save", func(db *gorm.DB, ev bool) error { return db.Save(created[ev]).Error }},
		{"delete", func(db *gorm.DB, ev bool) error { return db.Delete(created[ev]).Error }},
		{"create in a SkipDefaultTransaction session", func(db *gorm.DB, ev bool) error {
			// The Plugin opens a transaction for the model with events
			// (BEGIN and COMMIT are not statements here).
			return db.Session(&gorm.Session{SkipDefaultTransaction: true}).Create(newOrder(ev, "s")).Error
		}},
		{"transaction: 3 creates, an update, a delete, a nested transaction, Enqueue", func(db *gorm.DB, ev bool) error {
			return db.Transaction(func(tx *gorm.DB) error {
				a, b := newOrder(ev, "a"), newOrder(ev, "b")
				for _, o := range []any{a, b, newOrder(ev, "c")} {
					if err := tx.Create(o).Error; err != nil {
						return err
					}
				}
				if err := tx.Model(a).Update("status", "x").Error; err != nil {
					return err
				}
				if err := tx.Delete(b).Error; err != nil {
					return err
				}
				if err := tx.Transaction(func(tx2 *gorm.DB) error { return tx2.Create(newOrder(ev, "n")).Error }); err != nil {
					return err
				}
				if ev {
					return gormoutbox.Enqueue(tx, core.Event{EventType: "x.extra"})
				}
				return nil
			})
		}},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			e := newEnv(t, b, &gormoutbox.Plugin{}, nil)
			created = map[bool]any{true: newOrder(true, "u"), false: newOrder(false, "u")}
			for _, o := range created {
				if err := e.db.Create(o).Error; err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range paths {
				count := func(ev bool) int64 {
					before := e.stmts.Load()
					if err := p.run(e.db, ev); err != nil {
						t.Fatalf("%s: %v", p.name, err)
					}
					return e.stmts.Load() - before
				}
				plain, withEvents := count(false), count(true)
				t.Logf("%s: %d statements without events, %d with", p.name, plain, withEvents)
				if withEvents != plain+1 {
					t.Errorf("%s: %d statements with events, %d without: want exactly one more", p.name, withEvents, plain)
				}
			}
			// setup 1, create 1, batches 400, update, save, delete 3,
			// SkipDefaultTransaction 1, transaction 7.
			if n := len(e.outboxRows(t)); n != 413 {
				t.Errorf("%d events written, want 413", n)
			}
		})
	}
}
