package gormoutbox

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// OutboxEvent is the outbox row as a GORM model of the PostgreSQL schema of
// dialect's migrations, so that db.AutoMigrate(&gormoutbox.OutboxEvent{})
// creates the same table, defaults and partial indexes as dialect.Migrate
// (a test compares the catalogs). Use it to read the outbox with GORM; the
// Plugin and Enqueue write rows with the dialect's INSERT, not through it.
//
// The model is the default table (dialect.DefaultTable) on PostgreSQL. For
// another table name, MySQL or SQLite, whose types and indexes GORM tags
// cannot declare portably (no partial indexes on MySQL; fixed-format text
// timestamps on SQLite), use AutoMigrate, which runs the SQL migrations in
// those cases. Reading rows through the model works on every database.
type OutboxEvent struct {
	// ID is Event.Seq (BIGSERIAL), also a column of the claim, dead-letter
	// and ordered-mode indexes.
	ID int64 `gorm:"column:id;type:bigserial;primaryKey;autoIncrement;index:outbox_events_claim,priority:2;index:outbox_events_dead,priority:2;index:outbox_events_ordered_due,where:published_at IS NULL AND dead_at IS NULL;index:outbox_events_ordered_failed,priority:2;index:outbox_events_dead_seq,where:dead_at IS NOT NULL"`
	// EventID is Event.ID, a UUID.
	EventID string `gorm:"column:event_id;type:uuid;not null"`
	// AggregateType, AggregateID and EventType are the Event's.
	AggregateType string `gorm:"column:aggregate_type;type:text;not null;default:''"`
	AggregateID   string `gorm:"column:aggregate_id;type:text;not null;default:'';index:outbox_events_ordered_failed,priority:1,where:published_at IS NULL AND attempt_count > 0"`
	EventType     string `gorm:"column:event_type;type:text;not null;index:outbox_events_dead_type,where:dead_at IS NOT NULL"`
	// Payload is the event body (JSONB).
	Payload json.RawMessage `gorm:"column:payload;type:jsonb;not null"`
	// Headers is the event's headers as a JSON object (JSONB).
	Headers json.RawMessage `gorm:"column:headers;type:jsonb;not null;default:'{}'"`
	// CreatedAt is set by the database when the row is written.
	CreatedAt time.Time `gorm:"column:created_at;type:timestamptz;not null;default:now();autoCreateTime:false"`
	// PublishedAt, AttemptCount, LastError, NextAttemptAt and DeadAt are
	// the relay's bookkeeping (see core.Event).
	PublishedAt   *time.Time `gorm:"column:published_at;type:timestamptz;index:outbox_events_published,where:published_at IS NOT NULL"`
	AttemptCount  int        `gorm:"column:attempt_count;type:integer;not null;default:0"`
	LastError     *string    `gorm:"column:last_error;type:text"`
	NextAttemptAt time.Time  `gorm:"column:next_attempt_at;type:timestamptz;not null;default:now();index:outbox_events_claim,priority:1,where:published_at IS NULL AND dead_at IS NULL"`
	DeadAt        *time.Time `gorm:"column:dead_at;type:timestamptz;index:outbox_events_dead,priority:1,where:dead_at IS NOT NULL"`
}

// TableName returns dialect.DefaultTable.
func (OutboxEvent) TableName() string { return dialect.DefaultTable }

// Event converts the row to a core.Event.
func (r *OutboxEvent) Event() (core.Event, error) {
	ev := core.Event{
		Seq:           r.ID,
		ID:            r.EventID,
		AggregateType: r.AggregateType,
		AggregateID:   r.AggregateID,
		EventType:     r.EventType,
		Payload:       r.Payload,
		CreatedAt:     r.CreatedAt,
		PublishedAt:   r.PublishedAt,
		AttemptCount:  r.AttemptCount,
		NextAttemptAt: r.NextAttemptAt,
		DeadAt:        r.DeadAt,
	}
	if r.LastError != nil {
		ev.LastError = *r.LastError
	}
	if len(r.Headers) > 0 {
		if err := json.Unmarshal(r.Headers, &ev.Headers); err != nil {
			return core.Event{}, fmt.Errorf("gormoutbox: headers of event %s: %w", r.EventID, err)
		}
		if len(ev.Headers) == 0 {
			ev.Headers = nil
		}
	}
	return ev, nil
}

// MigrateOptions configures AutoMigrate.
type MigrateOptions struct {
	// Table is the outbox table. Default dialect.DefaultTable.
	Table string
	// Inbox also creates the consumers' inbox table.
	Inbox bool
	// SkipOrdered leaves out ordered mode's indexes and lease tables (see
	// dialect.MigrateOptions.SkipOrdered).
	SkipOrdered bool
	// Logger receives one line per SQL migration applied. Default
	// slog.Default().
	Logger *slog.Logger
}

// AutoMigrate creates or completes the outbox table, with what ordered
// mode needs (unless SkipOrdered) and the inbox table (with Inbox), on db.
// On PostgreSQL with the default table it first runs GORM's AutoMigrate of
// OutboxEvent; then, on every database, dialect.Migrate on the *sql.DB
// under GORM, which records the versions and adds what a GORM model cannot
// declare (the lease tables of ordered mode). Both give the same schema,
// and either may follow the other.
func AutoMigrate(db *gorm.DB, opts MigrateOptions) error {
	d, err := dialect.ByName(db.Dialector.Name())
	if err != nil {
		return fmt.Errorf("gormoutbox: dialector %q: %w", db.Dialector.Name(), err)
	}
	table := opts.Table
	if table == "" {
		table = dialect.DefaultTable
	}
	if d == dialect.Postgres && table == dialect.DefaultTable {
		if err := db.AutoMigrate(&OutboxEvent{}); err != nil {
			return fmt.Errorf("gormoutbox: automigrate %s: %w", table, err)
		}
	}
	sqlDB, err := db.DB()
	if err != nil {
		return fmt.Errorf("gormoutbox: %w", err)
	}
	ctx := db.Statement.Context
	if ctx == nil {
		ctx = context.Background()
	}
	if err := dialect.Migrate(ctx, sqlDB, d, dialect.MigrateOptions{Table: table, SkipInbox: !opts.Inbox, SkipOrdered: opts.SkipOrdered, Logger: opts.Logger}); err != nil {
		return fmt.Errorf("gormoutbox: %w", err)
	}
	return nil
}
