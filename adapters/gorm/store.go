package gormoutbox

import (
	"fmt"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"

	"gorm.io/gorm"
)

// Store is the relay's core.Store (with core.StatsReader, core.Cleaner and
// the operators' dead-letter and replay tools) on a GORM database. It is the
// SQL store of adapters/sqlx on the *sql.DB under GORM: claims and marks are
// batched statements on the database connection, with nothing of GORM's
// per-statement machinery in the relay's path, and both adapters run the
// same SQL.
type Store = sqlxoutbox.Outbox

// StoreOptions configures NewStore; see sqlxoutbox.Options.
type StoreOptions = sqlxoutbox.Options

// NewStore returns the Store of the outbox table in db. The dialect
// defaults to the GORM dialector's and the table to the installed Plugin's
// (else dialect.DefaultTable).
func NewStore(db *gorm.DB, opts StoreOptions) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: gormoutbox.NewStore needs a *gorm.DB", core.ErrInvalidOptions)
	}
	if opts.Dialect.IsZero() {
		d, err := dialect.ByName(db.Dialector.Name())
		if err != nil {
			return nil, fmt.Errorf("txoutbox/gorm: dialector %q: %w (set StoreOptions.Dialect)", db.Dialector.Name(), err)
		}
		opts.Dialect = d
	}
	if opts.Table == "" {
		if p, ok := db.Config.ConnPool.(*pool); ok {
			opts.Table = p.out.q.Table().String()
		}
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("txoutbox/gorm: the *sql.DB under GORM: %w", err)
	}
	return sqlxoutbox.NewDB(sqlDB, opts)
}
