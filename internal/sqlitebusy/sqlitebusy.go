// Package sqlitebusy tells SQLite's "the database is busy" errors apart, for
// the inboxes that retry a transaction SQLite refused before it did
// anything.
package sqlitebusy

import (
	"errors"
	"strings"
)

// Is reports SQLITE_BUSY and SQLITE_LOCKED from modernc.org/sqlite (Code
// method) or mattn/go-sqlite3 (message text), without importing either.
func Is(err error) bool {
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
