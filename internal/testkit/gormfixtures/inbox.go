// Package gormfixtures holds the GORM test fixtures that several packages
// of this module share, apart from internal/testkit/fixtures so that tests without
// GORM do not compile it.
package gormfixtures

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox/gorminbox"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// Inbox is the gorminbox fixture on db, whose inbox table and effects
// table (fixtures.EffectsDDL) already exist; d is db's dialect.
func Inbox(t testing.TB, db *gorm.DB, d dialect.Dialect) *outboxtest.InboxFixture {
	t.Helper()
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	ib, err := gorminbox.New(db, gorminbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &outboxtest.InboxFixture{
		Inbox: ib,
		Effect: func(ctx context.Context, key string) error {
			tx := gorminbox.Tx(ctx)
			if tx == nil {
				return errors.New("no GORM transaction in the handler's context")
			}
			return tx.Exec(`INSERT INTO effects (effect_key) VALUES (?)`, key).Error
		},
		Effects:   func(ctx context.Context) (map[string]int, error) { return fixtures.CountEffects(ctx, sqlDB) },
		Processed: ib.Processed,
		Cleaner:   ib,
		Backdate: func(ctx context.Context, consumer, eventID string, age time.Duration) error {
			return db.WithContext(ctx).Exec(`UPDATE processed_events SET processed_at = ? WHERE consumer = ? AND event_id = ?`,
				d.TimeArg(time.Now().Add(-age)), consumer, eventID).Error
		},
	}
}
