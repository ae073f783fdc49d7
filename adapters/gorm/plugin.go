package gormoutbox

import (
	"errors"
	"fmt"
	"reflect"

	"gorm.io/gorm"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/wake"
)

// PluginName is the name the Plugin is registered under in
// gorm.Config.Plugins.
const PluginName = "txoutbox"

// ErrEvents is wrapped by the error a write fails with when its events were
// rejected before they were written: a model's OutboxEvents returned an
// error, an event was invalid (then core.ErrInvalidEvent is wrapped too), or
// an EnqueueHook failed. The model's statement is not committed without
// them: in GORM's default transaction it rolls back; in a transaction of
// yours, which already holds the model's row, Commit then fails and rolls
// the transaction back (see the package documentation).
var ErrEvents = errors.New("gormoutbox: events rejected")

// Op is the kind of write a model is asked for its events after.
type Op int

// The writes that ask a model for events.
const (
	// Create is db.Create, db.CreateInBatches and the insert half of
	// db.Save.
	Create Op = iota + 1
	// Update is db.Save, db.Update, db.Updates and UpdateColumn(s) on a
	// model value.
	Update
	// Delete is db.Delete, soft deletes included.
	Delete
)

// String returns "create", "update" or "delete".
func (op Op) String() string {
	switch op {
	case Create:
		return "create"
	case Update:
		return "update"
	case Delete:
		return "delete"
	}
	return fmt.Sprintf("Op(%d)", int(op))
}

// EventSource is implemented by models that emit events when they are
// written. The Plugin calls OutboxEvents after GORM's statement ran (so the
// generated primary key, created_at and the values set by BeforeCreate and
// friends are there), on every element of a slice of models, and only when
// the statement affected at least one row.
//
// The events are those of the value GORM wrote: for an update or delete by
// condition alone (db.Where(...).Delete(&Order{})) that value holds no data,
// so return nil for it and use Enqueue. An error fails the GORM call and
// rolls its statement back.
type EventSource interface {
	OutboxEvents(op Op) ([]core.Event, error)
}

// Plugin writes the events of EventSource models to the outbox, atomically
// with the models. Install it once, right after gorm.Open:
//
//	db.Use(gormoutbox.Plugin{})
//
// It registers callbacks on create, update and delete, and wraps the
// connection pool so that the events of a transaction are written with one
// INSERT just before its COMMIT (see the package documentation).
//
// A session with SkipDefaultTransaction that writes an EventSource model
// outside any transaction gets a transaction for that statement anyway: the
// events are worth nothing if they can be lost while the row is kept.
// Statements of other models keep running without one.
type Plugin struct {
	// Table is the outbox table. Default dialect.DefaultTable.
	Table string
	// Dialect is the outbox SQL to use. Default: chosen from the GORM
	// dialector's name ("postgres" or "sqlite").
	Dialect dialect.Dialect
	// Notifier, if set, is told after every commit that wrote events,
	// besides the relays running on the table's store in this process,
	// which are woken without it: use it to reach relays in other
	// processes (pgnotify.Notifier).
	Notifier core.Notifier
	// Hooks run on every event before it is validated and written, in the
	// producer's transaction and with the statement's context.
	Hooks []core.EnqueueHook
	// Limits bound the events accepted (core.Limits); an event beyond them
	// fails its write with an error wrapping core.ErrInvalidEvent. Default
	// core.DefaultLimits.
	Limits core.Limits
}

// Name returns PluginName.
func (Plugin) Name() string { return PluginName }

// Initialize installs the Plugin on db; gorm.DB.Use calls it.
func (p Plugin) Initialize(db *gorm.DB) error {
	o, err := p.build(db)
	if err != nil {
		return err
	}
	if _, ok := db.ConnPool.(*pool); ok {
		return fmt.Errorf("gormoutbox: Plugin already installed on this connection pool")
	}
	w := &pool{ConnPool: db.ConnPool, out: o}
	db.ConnPool = w
	db.Statement.ConnPool = w

	cb := db.Callback()
	errs := []error{
		cb.Create().After("gorm:begin_transaction").Before("gorm:before_create").Register("txoutbox:begin_transaction", o.begin),
		cb.Create().After("gorm:after_create").Before("gorm:commit_or_rollback_transaction").Register("txoutbox:create", o.collect(Create)),
		cb.Create().After("txoutbox:create").Before("gorm:commit_or_rollback_transaction").Register("txoutbox:commit_or_rollback_transaction", commitOrRollback),

		cb.Update().After("gorm:begin_transaction").Before("gorm:before_update").Register("txoutbox:begin_transaction", o.begin),
		cb.Update().After("gorm:after_update").Before("gorm:commit_or_rollback_transaction").Register("txoutbox:update", o.collect(Update)),
		cb.Update().After("txoutbox:update").Before("gorm:commit_or_rollback_transaction").Register("txoutbox:commit_or_rollback_transaction", commitOrRollback),

		cb.Delete().After("gorm:begin_transaction").Before("gorm:before_delete").Register("txoutbox:begin_transaction", o.begin),
		cb.Delete().After("gorm:after_delete").Before("gorm:commit_or_rollback_transaction").Register("txoutbox:delete", o.collect(Delete)),
		cb.Delete().After("txoutbox:delete").Before("gorm:commit_or_rollback_transaction").Register("txoutbox:commit_or_rollback_transaction", commitOrRollback),
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gormoutbox: register callbacks: %w", err)
	}
	return nil
}

// outbox is an installed Plugin: its SQL and its wake-up.
type outbox struct {
	q        *dialect.Queries
	notifier core.Notifier
	hooks    []core.EnqueueHook
	limits   core.Limits
	wake     *core.Signal // the relays of this process on the table
}

// build resolves p's defaults against db's dialector. The SQL keeps the
// dialect's native placeholders: it runs on the connection under GORM, not
// through GORM's ? rewriting.
func (p Plugin) build(db *gorm.DB) (*outbox, error) {
	d := p.Dialect
	if d.IsZero() {
		var err error
		if d, err = dialect.ByName(db.Dialector.Name()); err != nil {
			return nil, fmt.Errorf("gormoutbox: dialector %q: %w (set Plugin.Dialect)", db.Dialector.Name(), err)
		}
	}
	native, err := dialect.ByName(d.Name())
	if err != nil {
		return nil, fmt.Errorf("gormoutbox: %w", err)
	}
	q, err := d.WithPlaceholders(native.Placeholders()).Queries(p.Table)
	if err != nil {
		return nil, fmt.Errorf("gormoutbox: %w", err)
	}
	limits, err := p.Limits.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("gormoutbox: %w", err)
	}
	sqlDB, err := sqlDBOf(db.ConnPool)
	if err != nil {
		return nil, fmt.Errorf("gormoutbox: the *sql.DB under GORM: %w", err)
	}
	return &outbox{q: q, notifier: p.Notifier, hooks: p.Hooks, limits: limits, wake: wake.For(sqlDB, q.Table().String())}, nil
}

// startedKey marks a statement whose transaction the Plugin opened.
const startedKey = "txoutbox:started_transaction"

// begin opens a transaction for a statement that writes an EventSource
// model outside any transaction: in a SkipDefaultTransaction session, or
// when GORM could not begin its own. It runs before the statement, so that
// nothing was written when it fails.
func (o *outbox) begin(db *gorm.DB) {
	if db.Error != nil || db.DryRun || inTransaction(db.Statement.ConnPool) || !declaresEvents(db.Statement.ReflectValue) {
		return
	}
	tx := db.Begin()
	if tx.Error != nil {
		db.AddError(fmt.Errorf("gormoutbox: begin the transaction for %s's events: %w", db.Statement.ReflectValue.Type(), tx.Error))
		return
	}
	db.Statement.ConnPool = tx.Statement.ConnPool
	db.InstanceSet(startedKey, true)
}

// commitOrRollback ends the transaction begin opened, as GORM's
// commit_or_rollback_transaction ends its own.
func commitOrRollback(db *gorm.DB) {
	if _, ok := db.InstanceGet(startedKey); !ok {
		return
	}
	if db.Error != nil {
		db.Rollback()
	} else {
		db.Commit()
	}
	db.Statement.ConnPool = db.ConnPool
}

// collect asks the written models for their events and enqueues them in the
// statement's transaction.
func (o *outbox) collect(op Op) func(*gorm.DB) {
	return func(db *gorm.DB) {
		if db.Error != nil || db.DryRun || db.RowsAffected == 0 {
			return
		}
		events, err := modelEvents(db.Statement.ReflectValue, op)
		if err == nil && len(events) > 0 {
			err = o.enqueue(db, events)
		}
		if err == nil {
			return
		}
		db.AddError(err)
		// The model's row is written: its transaction must not commit
		// without the events. GORM's own transaction rolls back on the
		// error; a caller's transaction is refused at Commit.
		if t := txOf(db.Statement.ConnPool); t != nil {
			t.refuse(err)
		}
	}
}

var eventSourceType = reflect.TypeFor[EventSource]()

// declaresEvents reports whether v (a model, or a slice or array of them)
// is of a type that implements EventSource, without calling it: the events
// may depend on values the statement has yet to generate.
func declaresEvents(v reflect.Value) bool {
	if !v.IsValid() {
		return false
	}
	t := v.Type()
	if k := t.Kind(); k == reflect.Slice || k == reflect.Array {
		t = t.Elem()
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Implements(eventSourceType) || reflect.PointerTo(t).Implements(eventSourceType)
}

// modelEvents gathers the events of v, a model or a slice or array of
// models, in order.
func modelEvents(v reflect.Value, op Op) ([]core.Event, error) {
	if !v.IsValid() || !declaresEvents(v) {
		return nil, nil
	}
	switch v.Kind() {
	case reflect.Slice, reflect.Array:
		var all []core.Event
		for i := range v.Len() {
			evs, err := oneModel(v.Index(i), op)
			if err != nil {
				return nil, err
			}
			all = append(all, evs...)
		}
		return all, nil
	}
	return oneModel(v, op)
}

func oneModel(v reflect.Value, op Op) ([]core.Event, error) {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil, nil
		}
		if src, ok := v.Interface().(EventSource); ok {
			return sourceEvents(src, op)
		}
		v = v.Elem()
	}
	if v.CanAddr() {
		if src, ok := v.Addr().Interface().(EventSource); ok {
			return sourceEvents(src, op)
		}
	}
	if src, ok := v.Interface().(EventSource); ok {
		return sourceEvents(src, op)
	}
	return nil, nil
}

func sourceEvents(src EventSource, op Op) ([]core.Event, error) {
	evs, err := src.OutboxEvents(op)
	if err != nil {
		return nil, fmt.Errorf("%w: %T on %s: %w", ErrEvents, src, op, err)
	}
	return evs, nil
}
