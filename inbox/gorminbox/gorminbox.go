// Package gorminbox is the txoutbox inbox on GORM: a core.Inbox that records
// processed events with a *gorm.DB and hands the handler the GORM
// transaction. Use it with inbox.NewMiddleware:
//
//	ib, err := gorminbox.New(db, gorminbox.Options{})
//	mw, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: "inventory"})
//	router.AddMiddleware(mw)
//	// in a handler:
//	tx := gorminbox.Tx(msg.Context())
//	tx.Model(&Stock{}).Where("sku = ?", sku).Update("qty", gorm.Expr("qty - ?", n))
//
// It is its own package so that users of database/sql and sqlx do not
// compile GORM.
package gorminbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"gorm.io/gorm"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/lockretry"
)

// Options configures New.
type Options struct {
	// Table is the inbox table, optionally schema-qualified. Default
	// dialect.DefaultInboxTable ("processed_events"). Create it with
	// dialect.Migrate.
	Table string
}

// Inbox is a core.Inbox on GORM, for PostgreSQL, MySQL/MariaDB and SQLite. It also deletes
// old records (DeleteProcessed) for inbox.Cleanup.
type Inbox struct {
	db *gorm.DB
	q  *dialect.InboxQueries
	d  dialect.Dialect
}

var _ core.Inbox = (*Inbox)(nil)

// New returns an inbox on db, whose dialector must be PostgreSQL, MySQL or
// SQLite.
// It does not create the table: run dialect.Migrate first.
func New(db *gorm.DB, opts Options) (*Inbox, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: gorminbox.New needs a *gorm.DB", core.ErrInvalidOptions)
	}
	d, err := dialect.ByName(db.Dialector.Name())
	if err != nil {
		return nil, fmt.Errorf("%w: gorminbox supports the postgres, mysql and sqlite dialectors: %w", core.ErrInvalidOptions, err)
	}
	// GORM rewrites ? to the dialector's own placeholders.
	q, err := d.WithPlaceholders(dialect.Question).InboxQueries(opts.Table)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", core.ErrInvalidOptions, err)
	}
	return &Inbox{db: db, q: q, d: d}, nil
}

type txKey struct{}

// Tx returns the GORM transaction that the inbox opened for the handler
// whose context ctx is, bound to ctx, or nil outside such a handler. Write
// the handler's effects through it so that they commit or roll back with the
// inbox record.
func Tx(ctx context.Context) *gorm.DB {
	tx, _ := ctx.Value(txKey{}).(*gorm.DB)
	if tx == nil {
		return nil
	}
	return tx.WithContext(ctx)
}

// ContextWithTx returns ctx carrying tx as Tx finds it, for testing a
// handler without the middleware.
func ContextWithTx(ctx context.Context, tx *gorm.DB) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// errDuplicate rolls the transaction back when the record already exists.
var errDuplicate = errors.New("gorminbox: already processed")

// Process implements core.Inbox: it records (consumer, eventID) and runs fn
// in one GORM transaction, which fn finds with Tx. It returns (false, nil)
// without running fn when the pair was recorded before. An error or panic of
// fn rolls the transaction back.
//
// On SQLite, give every connection a busy_timeout (in the DSN) so that
// concurrent writers wait for each other instead of failing.
func (ib *Inbox) Process(ctx context.Context, consumer, eventID string, fn func(ctx context.Context) error) (bool, error) {
	if consumer == "" {
		return false, fmt.Errorf("%w: gorminbox: empty consumer", core.ErrInvalidOptions)
	}
	if eventID == "" {
		return false, core.ErrMissingEventID
	}
	if err := dialect.CheckInboxKey(consumer, eventID); err != nil {
		return false, err
	}
	var fnErr error
	var ran bool
	start, wait := time.Now(), time.Millisecond
	for {
		err := ib.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			q, args := ib.q.Record(consumer, eventID)
			res := tx.Exec(q, args...)
			if res.Error != nil {
				return fmt.Errorf("gorminbox: record event %s for %s: %w", eventID, consumer, res.Error)
			}
			if res.RowsAffected == 0 {
				return errDuplicate
			}
			// fn's error is kept apart so that it reaches the caller
			// unwrapped and distinguishable from the inbox's own failures.
			ran = true
			fnErr = fn(context.WithValue(ctx, txKey{}, tx))
			return fnErr
		})
		// SQLite refuses a second writer with SQLITE_BUSY when the DSN set
		// no busy_timeout; MySQL makes a concurrent duplicate's INSERT a
		// deadlock victim when the delivery it waited for rolled back.
		// Before fn ran nothing happened, so trying again is safe.
		if err == nil || ran || !lockretry.Retryable(ib.d, err) || time.Since(start) >= busyTimeout {
			return ib.result(err, fnErr)
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("gorminbox: %w (after %w)", ctx.Err(), err)
		case <-time.After(wait/2 + rand.N(wait/2+1)):
		}
		wait = min(2*wait, 25*time.Millisecond)
	}
}

// busyTimeout bounds the retries of an INSERT refused as busy (SQLite) or
// as a deadlock victim (MySQL).
const busyTimeout = 30 * time.Second

func (ib *Inbox) result(err, fnErr error) (bool, error) {
	switch {
	case errors.Is(err, errDuplicate):
		return false, nil
	case err == nil:
		return true, nil
	case fnErr != nil && err == fnErr:
		return false, fnErr
	case fnErr != nil:
		return false, errors.Join(fnErr, err)
	}
	return false, fmt.Errorf("gorminbox: %w", err)
}

// DeleteProcessed deletes at most limit records processed before the given
// time, of every consumer, and returns how many it deleted.
func (ib *Inbox) DeleteProcessed(ctx context.Context, before time.Time, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("%w: DeleteProcessed limit %d", core.ErrInvalidOptions, limit)
	}
	q, args := ib.q.DeleteProcessedBefore(before, limit)
	res := ib.db.WithContext(ctx).Exec(q, args...)
	if res.Error != nil {
		return 0, fmt.Errorf("gorminbox: delete processed before %s: %w", before.Format(time.RFC3339), res.Error)
	}
	return res.RowsAffected, nil
}

// Processed reports whether (consumer, eventID) is recorded, for tests and
// tools.
func (ib *Inbox) Processed(ctx context.Context, consumer, eventID string) (bool, error) {
	q, args := ib.q.Exists(consumer, eventID)
	var n int64
	if err := ib.db.WithContext(ctx).Raw(q, args...).Scan(&n).Error; err != nil {
		return false, fmt.Errorf("gorminbox: look up event %s for %s: %w", eventID, consumer, err)
	}
	return n > 0, nil
}
