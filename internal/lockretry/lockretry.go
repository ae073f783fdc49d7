// Package lockretry tells apart the errors with which a database refuses a
// statement because of another transaction's locks, for the inboxes that
// retry a transaction refused before it did anything: SQLite's "database
// is busy", and MySQL's deadlock and lock wait timeout.
package lockretry

import (
	"errors"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/txoutbox/txoutbox/dialect"
)

// Retryable reports whether err, from a database of dialect d, is a
// refusal of that kind: SQLiteBusy on SQLite, MySQLConflict on MySQL, and
// nothing on PostgreSQL, whose writers wait for each other.
func Retryable(d dialect.Dialect, err error) bool {
	switch d {
	case dialect.SQLite:
		return SQLiteBusy(err)
	case dialect.MySQL:
		return MySQLConflict(err)
	}
	return false
}

// SQLiteBusy reports SQLITE_BUSY and SQLITE_LOCKED from modernc.org/sqlite
// (Code method) or mattn/go-sqlite3 (message text), without importing
// either.
func SQLiteBusy(err error) bool {
	var coded interface{ Code() int }
	if errors.As(err, &coded) {
		if c := coded.Code() & 0xff; c == 5 || c == 6 {
			return true
		}
	}
	msg := err.Error()
	return strings.Contains(msg, "SQLITE_BUSY") || strings.Contains(msg, "database is locked") ||
		strings.Contains(msg, "database table is locked")
}

// MySQLConflict reports MySQL's and MariaDB's ER_LOCK_DEADLOCK (1213),
// which rolled the transaction back, and ER_LOCK_WAIT_TIMEOUT (1205).
// Concurrent duplicates of one event meet the first when the delivery that
// held the key rolls back: the waiting ones both upgrade their shared
// locks, and InnoDB picks a victim.
func MySQLConflict(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number == 1213 || me.Number == 1205
	}
	return false
}
