package dialect

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
)

// sqliteLocks holds the SQLite session locks of this process by name:
// SQLite has no named lock a connection can hold, and an exclusive
// transaction would stop every writer of the database.
var sqliteLocks sync.Map

// TryLock takes the named lock of the database without waiting: on
// PostgreSQL a transaction-level advisory lock (pg_try_advisory_xact_lock
// of a hash of name, which is per database) in a transaction left open
// until release, GET_LOCK on MySQL and MariaDB (of a hash of the
// database's name and name). Both are held by one connection taken from db
// for as long as the lock is, and vanish with it, so a process killed
// while holding one frees it. On PostgreSQL the open transaction keeps the
// connection's server session through a pooler in transaction mode
// (PgBouncer), where a session-level lock would be taken by whichever
// server connection ran the statement; it writes nothing and holds no
// snapshot between statements, so it holds vacuum back no more than an
// idle session (a server's idle_in_transaction_session_timeout ends it,
// and the lock with it). On SQLite the lock is only
// this process's, per *sql.DB: two processes on one SQLite file can both
// hold it.
//
// ok is false when another session holds the lock. Call release once when
// done; it is safe to call after ctx is cancelled.
func (d Dialect) TryLock(ctx context.Context, db *sql.DB, name string) (release func(), ok bool, err error) {
	if err := d.check(); err != nil {
		return nil, false, err
	}
	if name == "" {
		return nil, false, errors.New("dialect: TryLock needs a lock name")
	}
	if d.kind == kindSQLite {
		key := fmt.Sprintf("%p/%s", db, name)
		if _, held := sqliteLocks.LoadOrStore(key, struct{}{}); held {
			return nil, false, nil
		}
		var once sync.Once
		return func() { once.Do(func() { sqliteLocks.Delete(key) }) }, true, nil
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("dialect: lock %q: %w", name, err)
	}
	var got sql.NullInt64
	var unlock string
	var arg any
	switch d.kind {
	case kindPostgres:
		return tryXactLock(ctx, conn, name)
	default:
		// GET_LOCK names are server-wide and at most 64 characters: the
		// name is scoped to the database, hashed.
		const lockName = "CONCAT('txoutbox:', SHA1(CONCAT(DATABASE(), ':', ?)))"
		arg = name
		err = conn.QueryRowContext(ctx, "SELECT GET_LOCK("+lockName+", 0)", arg).Scan(&got)
		unlock = "DO RELEASE_LOCK(" + lockName + ")"
	}
	if err != nil || got.Int64 != 1 {
		conn.Close()
		if err != nil {
			return nil, false, fmt.Errorf("dialect: lock %q: %w", name, err)
		}
		return nil, false, nil
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			// A connection that cannot unlock is discarded, which unlocks.
			if _, err := conn.ExecContext(context.WithoutCancel(ctx), unlock, arg); err != nil {
				_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			}
			conn.Close()
		})
	}, true, nil
}

// tryXactLock takes PostgreSQL's lock of TryLock on conn, in a transaction
// that release rolls back.
func tryXactLock(ctx context.Context, conn *sql.Conn, name string) (release func(), ok bool, err error) {
	h := fnv.New64a()
	h.Write([]byte("txoutbox:" + name))
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		conn.Close()
		return nil, false, fmt.Errorf("dialect: lock %q: %w", name, err)
	}
	var got bool
	if err := tx.QueryRowContext(ctx, "SELECT pg_try_advisory_xact_lock($1)", int64(h.Sum64())).Scan(&got); err != nil || !got {
		_ = tx.Rollback()
		conn.Close()
		if err != nil {
			return nil, false, fmt.Errorf("dialect: lock %q: %w", name, err)
		}
		return nil, false, nil
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			// A connection that cannot roll back is discarded, which
			// ends the transaction and its lock.
			if err := tx.Rollback(); err != nil {
				_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			}
			conn.Close()
		})
	}, true, nil
}
