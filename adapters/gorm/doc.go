// Package gormoutbox is txoutbox's GORM adapter: a model's events go to the
// outbox in the transaction GORM writes the model in, without hand-written
// inserts.
//
// A model declares its events by implementing EventSource:
//
//	func (o *Order) OutboxEvents(op gormoutbox.Op) ([]core.Event, error) {
//		if op != gormoutbox.Create {
//			return nil, nil
//		}
//		ev, err := core.NewEvent("order", strconv.FormatInt(o.ID, 10), "order.created", o)
//		return []core.Event{ev}, err
//	}
//
// and the Plugin, installed once with db.Use(gormoutbox.Plugin{}), asks every
// created, updated or deleted model for them after GORM's statement ran, so
// that generated primary keys and timestamps are set. The events are written
// in the same transaction as the model: GORM's default transaction, a
// db.Transaction block, or one the Plugin opens for a SkipDefaultTransaction
// session. A rollback leaves neither the model nor its events.
//
// The outbox costs at most one statement per transaction: the Plugin collects
// the events of all writes (and of explicit Enqueue calls) of a transaction
// and writes them with one multi-row INSERT just before COMMIT (up to
// dialect.MaxInsertRows events; more take one more statement per
// MaxInsertRows). Events of a nested db.Transaction that rolls back to its
// savepoint are dropped with it. The write happens beneath GORM, so GORM's
// logger does not show it, and the events are not visible to queries in
// their own transaction before it commits. Transactions the Plugin cannot
// follow (those begun on the dedicated connection of db.Connection, or from
// a session made before db.Use) get their events written at once instead,
// one INSERT per write: still atomic, one statement more per write.
//
// The relay reads the outbox through Store, which is the SQL store of
// adapters/sqlx on the *sql.DB under GORM, so that both adapters run the same
// claim and mark statements. The schema is dialect's; the OutboxEvent model
// lets db.AutoMigrate create the same table and indexes on PostgreSQL, and
// AutoMigrate creates it on every database. It works with GORM's
// postgres, mysql (MySQL 8.0.13+, MariaDB 10.6+) and sqlite dialectors; on
// MySQL, open the DSN with parseTime=true, as GORM needs for any
// time.Time field.
package gormoutbox
