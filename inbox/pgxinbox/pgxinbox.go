// Package pgxinbox is the inbox (core.Inbox) on github.com/jackc/pgx/v5,
// for PostgreSQL: Process records (consumer, event_id) in the table
// processed_events and runs the handler in the same pgx.Tx, which the
// handler reaches with Tx. Use it with inbox.NewMiddleware:
//
//	ib, err := pgxinbox.New(pool, pgxinbox.Options{})
//	dedup, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: "inventory"})
//	router.AddMiddleware(dedup)
//
// Create the table with pgxoutbox.Migrate (or `txoutbox migrate`).
package pgxinbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// DB is what New needs from a database handle: *pgxpool.Pool satisfies it.
// (A *pgx.Conn does too, but serves one delivery at a time.)
type DB interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Options configures New. Zero fields take their defaults.
type Options struct {
	// Table is the inbox table, optionally schema-qualified. Default
	// dialect.DefaultInboxTable ("processed_events").
	Table string
	// TxOptions are passed to BeginTx. Default: the database's default
	// isolation (READ COMMITTED), under which a concurrent duplicate waits
	// for the first delivery's transaction and then skips. Under
	// REPEATABLE READ or SERIALIZABLE it fails with a serialization error
	// instead, which the router turns into a redelivery that then skips.
	TxOptions pgx.TxOptions
}

// Inbox is a core.Inbox on pgx. It also deletes old records
// (DeleteProcessed) for inbox.Cleanup.
type Inbox struct {
	db   DB
	q    *dialect.InboxQueries
	opts Options
}

var _ core.Inbox = (*Inbox)(nil)

// New returns an inbox that records processed events in opts.Table through
// db. It does not create the table.
func New(db DB, opts Options) (*Inbox, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: pgxinbox.New needs a database handle", core.ErrInvalidOptions)
	}
	q, err := dialect.Postgres.InboxQueries(opts.Table)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", core.ErrInvalidOptions, err)
	}
	return &Inbox{db: db, q: q, opts: opts}, nil
}

// Table returns the inbox table's name.
func (s *Inbox) Table() string { return s.q.Table().String() }

type txKey struct{}

// Tx returns the transaction that the inbox opened for the handler whose
// context ctx is, or nil outside such a handler. Write the handler's
// effects through it, not through the pool: only then do they commit or
// roll back with the inbox record.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

// ContextWithTx returns ctx carrying tx as Tx finds it, for testing a
// handler without the middleware.
func ContextWithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// Process implements core.Inbox: it records (consumer, eventID) and runs fn
// in one transaction, which fn finds with Tx. It returns (false, nil)
// without running fn when the pair was recorded before. An error or panic
// of fn rolls the transaction back; the error is returned as it is, the
// panic goes on.
func (s *Inbox) Process(ctx context.Context, consumer, eventID string, fn func(ctx context.Context) error) (processed bool, err error) {
	if consumer == "" {
		return false, fmt.Errorf("%w: pgxinbox: empty consumer", core.ErrInvalidOptions)
	}
	if eventID == "" {
		return false, core.ErrMissingEventID
	}
	if err := dialect.CheckInboxKey(consumer, eventID); err != nil {
		return false, err
	}
	tx, err := s.db.BeginTx(ctx, s.opts.TxOptions)
	if err != nil {
		return false, fmt.Errorf("pgxinbox: begin: %w", err)
	}
	// The rollback of a transaction that ends otherwise is a no-op; it
	// must survive a cancelled ctx, or the connection would go back to the
	// pool mid-transaction.
	rollback := func() error { return tx.Rollback(context.WithoutCancel(ctx)) }
	done := false
	defer func() {
		if !done {
			_ = rollback() // fn panicked
		}
	}()
	q, args := s.q.Record(consumer, eventID)
	tag, err := tx.Exec(ctx, q, args...)
	if err != nil {
		done = true
		_ = rollback()
		return false, fmt.Errorf("pgxinbox: record event %s for %s: %w", eventID, consumer, err)
	}
	if tag.RowsAffected() == 0 {
		// Already processed (and committed) by an earlier delivery.
		done = true
		_ = rollback()
		return false, nil
	}
	if err := fn(ContextWithTx(ctx, tx)); err != nil {
		done = true
		if rerr := rollback(); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
			return false, errors.Join(err, fmt.Errorf("pgxinbox: rollback: %w", rerr))
		}
		return false, err
	}
	done = true
	if err := tx.Commit(ctx); err != nil {
		// Unknown outcome at worst (connection lost during COMMIT): the
		// redelivery then either skips or processes, never both.
		return false, fmt.Errorf("pgxinbox: commit event %s for %s: %w", eventID, consumer, err)
	}
	return true, nil
}

// DeleteProcessed deletes at most limit records processed before the given
// time, of every consumer, and returns how many it deleted. inbox.Cleanup
// calls it in a loop.
func (s *Inbox) DeleteProcessed(ctx context.Context, before time.Time, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("%w: DeleteProcessed limit %d", core.ErrInvalidOptions, limit)
	}
	q, args := s.q.DeleteProcessedBefore(before, limit)
	tag, err := s.db.Exec(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("pgxinbox: delete processed before %s: %w", before.Format(time.RFC3339), err)
	}
	return tag.RowsAffected(), nil
}

// Processed reports whether (consumer, eventID) is recorded, for tests and
// tools.
func (s *Inbox) Processed(ctx context.Context, consumer, eventID string) (bool, error) {
	q, args := s.q.Exists(consumer, eventID)
	var one int
	switch err := s.db.QueryRow(ctx, q, args...).Scan(&one); {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("pgxinbox: look up event %s for %s: %w", eventID, consumer, err)
	}
	return true, nil
}
