package gormoutbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/fixtures"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// suiteOrder is the business row of the conformance suite's producer: a
// model that emits the suite's events, so that every event the suite checks
// went through the Plugin's callbacks.
type suiteOrder struct {
	ID     int64 `gorm:"primaryKey"`
	Events int
	events []core.Event
}

func (o *suiteOrder) OutboxEvents(op gormoutbox.Op) ([]core.Event, error) {
	if op != gormoutbox.Create {
		return nil, nil
	}
	return o.events, nil
}

var errSuiteRollback = errors.New("suite asked for a rollback")

// TestConformance runs the shared store suite on the GORM adapter: events
// written by a model's callbacks inside db.Transaction, claimed and marked
// through the Store on the *sql.DB under GORM.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.RunStore(t, func(t *testing.T) *outboxtest.StoreFixture {
				e := newEnv(t, b, &gormoutbox.Plugin{}, nil)
				if err := e.db.AutoMigrate(&suiteOrder{}); err != nil {
					t.Fatal(err)
				}
				store, err := gormoutbox.NewStore(e.db, gormoutbox.StoreOptions{Logger: discardLogger()})
				if err != nil {
					t.Fatal(err)
				}
				return &outboxtest.StoreFixture{
					Store: store,
					Enqueue: func(ctx context.Context, evs []core.Event, commit bool) error {
						err := e.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
							if err := tx.Create(&suiteOrder{Events: len(evs), events: evs}).Error; err != nil {
								return err
							}
							if !commit {
								return errSuiteRollback
							}
							return nil
						})
						if !commit && errors.Is(err, errSuiteRollback) {
							return nil
						}
						return err
					},
					Get:      store.Get,
					Backdate: e.backdate,
					Stats:    store,
					Cleaner:  store,
					// SQLite's claims are leases: two open claims never
					// share an event there either.
					ConcurrentClaims: true,
				}
			})
		})
	}
}

// backdate moves an event's timestamps back by age.
func (e *env) backdate(ctx context.Context, id string, age time.Duration) error {
	d := dialect.SQLite
	if e.name == "postgres" {
		d = dialect.Postgres
	}
	return fixtures.Backdate(ctx, e.sqlDB, d, dialect.DefaultTable, id, age)
}
