package gormoutbox

import (
	"fmt"
	"log/slog"
	"time"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"

	"gorm.io/gorm"
)

// Store is the relay's core.Store (with stats, cleanup and the operators'
// dead-letter and replay tools) on a GORM database. It is the SQL store of
// adapters/sqlx on the *sql.DB under GORM: claims and marks are batched
// statements on the database connection, with nothing of GORM's
// per-statement machinery in the relay's path, and both adapters run the
// same SQL. A relay on it is woken by the Plugin's commits in this process.
type Store = sqlxoutbox.Outbox

// StoreOptions configures NewStore. Zero fields take their defaults.
type StoreOptions struct {
	// Dialect of the database. Default: the GORM dialector's.
	Dialect dialect.Dialect
	// Table is the outbox table. Default: the installed Plugin's table,
	// else dialect.DefaultTable. With the Plugin installed it must be
	// empty or the Plugin's.
	Table string
	// ClaimLease: see sqlxoutbox.Options.ClaimLease (SQLite).
	ClaimLease time.Duration
	// SyncMark: see sqlxoutbox.Options.SyncMark (PostgreSQL).
	SyncMark bool
	// Logger receives the store's warnings. Default slog.Default().
	Logger *slog.Logger
}

// NewStore returns the Store of the outbox table in db.
func NewStore(db *gorm.DB, opts StoreOptions) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: gormoutbox.NewStore needs a *gorm.DB", core.ErrInvalidOptions)
	}
	if opts.Dialect.IsZero() {
		d, err := dialect.ByName(db.Dialector.Name())
		if err != nil {
			return nil, fmt.Errorf("gormoutbox: dialector %q: %w (set StoreOptions.Dialect)", db.Dialector.Name(), err)
		}
		opts.Dialect = d
	}
	if p, ok := db.Config.ConnPool.(*pool); ok {
		pluginTable := p.out.q.Table().String()
		if opts.Table != "" && opts.Table != pluginTable {
			return nil, fmt.Errorf("%w: StoreOptions.Table %q differs from the Plugin's table %q; the store relays what the Plugin writes, so leave it empty",
				core.ErrInvalidOptions, opts.Table, pluginTable)
		}
		opts.Table = pluginTable
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("gormoutbox: the *sql.DB under GORM: %w", err)
	}
	return sqlxoutbox.NewDB(sqlDB, sqlxoutbox.Options{
		Dialect: opts.Dialect, Table: opts.Table, ClaimLease: opts.ClaimLease, SyncMark: opts.SyncMark, Logger: opts.Logger,
	})
}
