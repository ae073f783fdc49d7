// Package pgxbridge gives each *pgxpool.Pool one *sql.DB over it, for the
// parts of txoutbox written against database/sql (the relay's store, the
// partition leaser, the migrations) when a service holds only a pool.
//
// Why one per pool, held weakly: a *sql.DB runs a goroutine until it is
// closed, so a bridge made per call would leak one each time, and a bridge
// that held its pool would keep the pool alive forever. The bridge's
// connector reaches the pool through a weak pointer, and the bridge is
// closed when its pool is garbage collected. Its connections are borrowed
// from the pool and given back after every use (no idle connections of its
// own), so it adds no connections to the pool's limit.
package pgxbridge

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"runtime"
	"sync"
	"weak"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// errPoolGone is what a bridge whose pool was collected reports; nothing
// can hold such a bridge, so it is seen at most by a call in flight.
var errPoolGone = errors.New("pgxbridge: the pool was garbage collected")

var (
	mu      sync.Mutex
	bridges = map[weak.Pointer[pgxpool.Pool]]*sql.DB{}
)

// DB returns the *sql.DB over pool, the same for every call with one pool.
// Closing the pool makes its operations fail; closing the returned DB is
// neither needed nor allowed.
func DB(pool *pgxpool.Pool) *sql.DB {
	k := weak.Make(pool)
	mu.Lock()
	defer mu.Unlock()
	if db, ok := bridges[k]; ok {
		return db
	}
	db := sql.OpenDB(connector{pool: k})
	// As stdlib.OpenDBFromPool: idle connections go back to the pool, where
	// its other users can have them.
	db.SetMaxIdleConns(0)
	bridges[k] = db
	runtime.AddCleanup(pool, func(k weak.Pointer[pgxpool.Pool]) {
		mu.Lock()
		db := bridges[k]
		delete(bridges, k)
		mu.Unlock()
		if db != nil {
			_ = db.Close()
		}
	}, k)
	return db
}

// connector opens the bridge's connections from its pool, as stdlib's pool
// connector does, without holding the pool.
type connector struct {
	pool weak.Pointer[pgxpool.Pool]
}

// Connect implements driver.Connector.
func (c connector) Connect(ctx context.Context) (driver.Conn, error) {
	p := c.pool.Value()
	if p == nil {
		return nil, errPoolGone
	}
	return stdlib.GetPoolConnector(p).Connect(ctx)
}

// Driver implements driver.Connector: pgx's, so that code recognising pgx
// connections (the relay's native claims) does here too.
func (c connector) Driver() driver.Driver { return stdlib.GetDefaultDriver() }
