package gormoutbox_test

import (
	"context"
	"testing"
	"time"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/gormfixtures"
	outboxtest "github.com/txoutbox/txoutbox/testing"
	"github.com/txoutbox/txoutbox/testing/sqlfixture"
)

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
				return gormfixtures.Store(t, e.db, e.dialect())
			})
		})
	}
}

// dialect is the env's dialect.
func (e *env) dialect() dialect.Dialect {
	d, err := dialect.ByName(e.name)
	if err != nil {
		panic(err)
	}
	return d
}

// backdate moves an event's timestamps back by age.
func (e *env) backdate(ctx context.Context, id string, age time.Duration) error {
	return sqlfixture.Backdate(ctx, e.sqlDB, e.dialect(), dialect.DefaultTable, id, age)
}

// TestOrderedConformance runs the ordered-claims suite on the GORM store.
func TestOrderedConformance(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.RunOrderedStore(t, func(t *testing.T) *outboxtest.StoreFixture {
				e := newEnv(t, b, &gormoutbox.Plugin{}, nil)
				return gormfixtures.Store(t, e.db, e.dialect())
			})
		})
	}
}
