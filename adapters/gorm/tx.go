package gormoutbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"

	"gorm.io/gorm"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// pool wraps the connection pool GORM runs on, so that every transaction
// GORM begins (its default transaction, db.Transaction, db.Begin) is a
// *txPool that can hold the transaction's events until its commit. GORM
// offers no commit callback; the pool is the one place that sees the commit.
type pool struct {
	gorm.ConnPool
	out *outbox
}

// BeginTx begins a transaction on the wrapped pool.
func (p *pool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	var inner gorm.ConnPool
	switch b := p.ConnPool.(type) {
	case gorm.TxBeginner:
		tx, err := b.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		inner = tx
	case gorm.ConnPoolBeginner:
		tx, err := b.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		inner = tx
	default:
		return nil, gorm.ErrInvalidTransaction
	}
	if _, ok := inner.(gorm.TxCommitter); !ok {
		return nil, gorm.ErrInvalidTransaction
	}
	return &txPool{ConnPool: inner, ctx: ctx, out: p.out, db: p}, nil
}

// GetDBConn returns the *sql.DB under the pool, for gorm.DB.DB.
func (p *pool) GetDBConn() (*sql.DB, error) { return sqlDBOf(p.ConnPool) }

// Ping pings the wrapped pool, for callers that ping through GORM's pool.
func (p *pool) Ping() error {
	if pinger, ok := p.ConnPool.(interface{ Ping() error }); ok {
		return pinger.Ping()
	}
	return nil
}

// txPool is a transaction begun through pool. It passes every statement to
// the transaction under it, keeps the events enqueued in it, and writes them
// with one INSERT right before COMMIT.
type txPool struct {
	gorm.ConnPool // the transaction; implements gorm.TxCommitter
	ctx           context.Context
	out           *outbox
	db            *pool

	mu      sync.Mutex
	pending []core.Event
	// marks are the open savepoints, oldest first, with the number of
	// events pending when each was taken.
	marks []mark
	done  bool
	// refused is the error of a model write whose events were refused
	// after the model's row was written; refusedDepth is len(marks) then.
	// Commit refuses to commit the row without its events, unless a
	// ROLLBACK TO a savepoint taken before the write undid it.
	refused      error
	refusedDepth int
}

type mark struct {
	name string
	n    int
}

func (t *txPool) add(events []core.Event) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return fmt.Errorf("%w: the transaction is already committed or rolled back", core.ErrNoTransaction)
	}
	t.pending = append(t.pending, events...)
	return nil
}

// refuse records that a model row written in t had its events refused.
func (t *txPool) refuse(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refused == nil {
		t.refused, t.refusedDepth = err, len(t.marks)
	}
}

// Commit writes the pending events and commits. If the write fails, or a
// model written in the transaction had its events refused, the transaction
// is rolled back and Commit fails, so that the models are not committed
// without their events.
func (t *txPool) Commit() error {
	t.mu.Lock()
	events, refused := t.pending, t.refused
	t.pending, t.marks, t.done = nil, nil, true
	t.mu.Unlock()
	if refused != nil {
		err := fmt.Errorf("gormoutbox: a model written in this transaction had its events refused, so the transaction was rolled back instead of committing the model without them: %w", refused)
		if rerr := t.ConnPool.(gorm.TxCommitter).Rollback(); rerr != nil {
			err = fmt.Errorf("%w (and rollback: %v)", err, rerr)
		}
		return err
	}
	if len(events) > 0 {
		if err := t.out.write(t.ctx, t.ConnPool, events); err != nil {
			if rerr := t.ConnPool.(gorm.TxCommitter).Rollback(); rerr != nil {
				err = fmt.Errorf("%w (and rollback: %v)", err, rerr)
			}
			return fmt.Errorf("%w; the transaction was rolled back", err)
		}
	}
	if err := t.ConnPool.(gorm.TxCommitter).Commit(); err != nil {
		return err
	}
	if len(events) > 0 {
		t.out.notify()
	}
	return nil
}

// Rollback drops the pending events and rolls back.
func (t *txPool) Rollback() error {
	t.mu.Lock()
	t.pending, t.marks, t.done = nil, nil, true
	t.mu.Unlock()
	return t.ConnPool.(gorm.TxCommitter).Rollback()
}

// ExecContext runs a statement in the transaction. It follows savepoints
// (GORM's nested db.Transaction): a ROLLBACK TO drops the events enqueued
// since the savepoint, as the database drops the rows.
func (t *txPool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := t.ConnPool.ExecContext(ctx, query, args...)
	if err == nil {
		t.savepoint(query)
	}
	return res, err
}

// savepoint updates the marks for a SAVEPOINT, ROLLBACK TO [SAVEPOINT] or
// RELEASE [SAVEPOINT] statement, and ignores every other statement.
func (t *txPool) savepoint(query string) {
	if len(query) > 64 {
		return // not a savepoint statement; spare the parse
	}
	f := strings.Fields(strings.TrimRight(query, "; \t\n"))
	if len(f) < 2 {
		return
	}
	verb := strings.ToUpper(f[0])
	switch {
	case verb == "SAVEPOINT" && len(f) == 2:
		t.mu.Lock()
		t.marks = append(t.marks, mark{name: f[1], n: len(t.pending)})
		t.mu.Unlock()
	case verb == "ROLLBACK" && len(f) >= 3 && strings.EqualFold(f[1], "TO"):
		name := f[len(f)-1]
		t.mu.Lock()
		if i := t.findMark(name); i >= 0 {
			// The savepoint stays after ROLLBACK TO; later ones are gone.
			t.pending = t.pending[:t.marks[i].n]
			t.marks = t.marks[:i+1]
			if t.refused != nil && t.refusedDepth > i {
				t.refused = nil // the refused model's row is gone too
			}
		}
		t.mu.Unlock()
	case verb == "RELEASE":
		name := f[len(f)-1]
		t.mu.Lock()
		if i := t.findMark(name); i >= 0 {
			t.marks = t.marks[:i]
		}
		t.mu.Unlock()
	}
}

func (t *txPool) findMark(name string) int {
	for i := len(t.marks) - 1; i >= 0; i-- {
		if t.marks[i].name == name {
			return i
		}
	}
	return -1
}

// StmtContext binds stmt to the transaction (gorm.Tx, used by GORM's
// prepared statement mode).
func (t *txPool) StmtContext(ctx context.Context, stmt *sql.Stmt) *sql.Stmt {
	if s, ok := t.ConnPool.(interface {
		StmtContext(context.Context, *sql.Stmt) *sql.Stmt
	}); ok {
		return s.StmtContext(ctx, stmt)
	}
	return stmt
}

// GetDBConn returns the *sql.DB the transaction runs on, for gorm.DB.DB.
func (t *txPool) GetDBConn() (*sql.DB, error) { return t.db.GetDBConn() }

// txOf returns the *txPool a statement runs in, or nil.
func txOf(cp gorm.ConnPool) *txPool {
	switch c := cp.(type) {
	case *txPool:
		return c
	case *gorm.PreparedStmtTX:
		if t, ok := c.Tx.(*txPool); ok {
			return t
		}
	}
	return nil
}

// inTransaction reports whether a statement on cp runs in a transaction.
func inTransaction(cp gorm.ConnPool) bool {
	_, ok := cp.(gorm.TxCommitter)
	return ok
}

// enqueue prepares events, runs the hooks and either adds them to the
// transaction's pending events or, in a transaction the Plugin does not
// manage (one begun on a *sql.Conn of db.Connection), writes them at once.
func (o *outbox) enqueue(db *gorm.DB, events []core.Event) error {
	ctx := db.Statement.Context
	if err := o.q.Dialect().PrepareEvents(ctx, events, o.limits, o.hooks); err != nil {
		return fmt.Errorf("%w: %w", ErrEvents, err)
	}
	cp := db.Statement.ConnPool
	if t := txOf(cp); t != nil {
		return t.add(events)
	}
	if !inTransaction(cp) {
		return fmt.Errorf("%w: gormoutbox.Enqueue needs a *gorm.DB in a transaction (db.Transaction, db.Begin)", core.ErrNoTransaction)
	}
	if err := o.write(ctx, cp, events); err != nil {
		return err
	}
	// The commit is still to come; the relay looks again a few times
	// within milliseconds when a wake-up finds nothing.
	o.notify()
	return nil
}

// write inserts events, at most dialect.MaxInsertRows per statement.
func (o *outbox) write(ctx context.Context, cp gorm.ConnPool, events []core.Event) error {
	// GORM's prepared statement mode would cache every batch size's INSERT
	// text; run on the transaction itself.
	if p, ok := cp.(*gorm.PreparedStmtTX); ok {
		cp = p.Tx
	}
	for len(events) > 0 {
		n := min(len(events), dialect.MaxInsertRows)
		// Nothing is written back into the events (Seq and CreatedAt are
		// the database's at the commit), so nothing is asked back: the
		// statement of sqlxoutbox's SkipReadBack, no RETURNING.
		q, args, err := o.q.InsertNoReturning(events[:n])
		if err != nil {
			return fmt.Errorf("gormoutbox: %w", err)
		}
		if _, err := cp.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("gormoutbox: insert %d events into %s: %w", n, o.q.Table(), err)
		}
		events = events[n:]
	}
	return nil
}

func (o *outbox) notify() {
	o.wake.Notify()
	if o.notifier != nil {
		o.notifier.Notify()
	}
}

// sqlDBOf returns the *sql.DB a GORM connection pool runs on.
func sqlDBOf(cp gorm.ConnPool) (*sql.DB, error) {
	switch c := cp.(type) {
	case *sql.DB:
		return c, nil
	case gorm.GetDBConnector:
		return c.GetDBConn()
	}
	return nil, gorm.ErrInvalidDB
}

// Enqueue adds events to the outbox in the transaction tx runs in, with
// tx's context (tx.WithContext, tx.Statement.Context). With the Plugin
// installed they are written with the transaction's other events just
// before COMMIT; in a transaction the Plugin does not manage they are
// written at once. Enqueue fails with core.ErrNoTransaction outside a
// transaction, and with an error wrapping core.ErrInvalidEvent for an invalid
// event. The events are prepared in place: their IDs are set when it returns;
// Seq and CreatedAt are assigned at the commit and are not written back.
func Enqueue(tx *gorm.DB, events ...core.Event) error {
	if tx == nil {
		return fmt.Errorf("%w: gormoutbox.Enqueue got a nil *gorm.DB", core.ErrNoTransaction)
	}
	if len(events) == 0 {
		return nil
	}
	o, err := outboxOf(tx)
	if err != nil {
		return err
	}
	return o.enqueue(tx, events)
}

// outboxOf finds the installed Plugin of tx, or builds the default one when
// none is installed.
func outboxOf(tx *gorm.DB) (*outbox, error) {
	if t := txOf(tx.Statement.ConnPool); t != nil {
		return t.out, nil
	}
	if p, ok := tx.Config.ConnPool.(*pool); ok {
		return p.out, nil
	}
	p, _ := tx.Config.Plugins[PluginName].(Plugin)
	return p.build(tx)
}

// PendingEvents returns the events enqueued in tx's transaction that the
// Plugin will write at its commit (its models' and Enqueue's), for tests of
// a producer (see outboxtest.RequireEnqueued). It returns nil outside a
// transaction the Plugin manages.
func PendingEvents(tx *gorm.DB) []core.Event {
	if tx == nil {
		return nil
	}
	t := txOf(tx.Statement.ConnPool)
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]core.Event(nil), t.pending...)
}
