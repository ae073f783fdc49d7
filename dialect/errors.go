package dialect

import (
	"errors"
	"fmt"
	"strings"

	"github.com/txoutbox/txoutbox/core"
)

// IsUndefinedTable reports whether err is a database's "no such table":
// PostgreSQL's SQLSTATE 42P01 (any driver that reports SQLSTATEs, such as
// pgx and lib/pq), SQLite's "no such table", MySQL's error 1146.
func IsUndefinedTable(err error) bool {
	if err == nil {
		return false
	}
	var st interface{ SQLState() string }
	if errors.As(err, &st) && st.SQLState() == "42P01" {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "no such table") || strings.Contains(msg, "(SQLSTATE 42P01)") ||
		strings.Contains(msg, "Error 1146 ")
}

// CheckMigrated returns err wrapped with core.ErrNotMigrated, naming table,
// when it says a table does not exist, and err unchanged otherwise.
// Retrying such an error cannot help: the relay returns it, and the CLI
// names the migration to run. An error of a prepared statement lost or
// duplicated between pooled connections gets the fix for that instead.
func CheckMigrated(err error, table Identifier) error {
	if IsPooledPreparedStatement(err) {
		return fmt.Errorf("%w (a connection pooler in transaction mode, such as PgBouncer before 1.21, hands each transaction another server connection, where pgx's cached prepared statements are missing or clash: add default_query_exec_mode=exec to the DSN; see docs/pgbouncer.md)", err)
	}
	if !IsUndefinedTable(err) || errors.Is(err, core.ErrNotMigrated) {
		return err
	}
	return fmt.Errorf("%w: table %s: %w", core.ErrNotMigrated, table, err)
}

// IsPooledPreparedStatement reports whether err is PostgreSQL's "prepared
// statement already exists" (SQLSTATE 42P05) or "does not exist" (26000):
// what a client that prepares statements meets behind a pooler that moves
// its transactions between server connections.
func IsPooledPreparedStatement(err error) bool {
	var st interface{ SQLState() string }
	if err == nil || !errors.As(err, &st) {
		return false
	}
	return st.SQLState() == "42P05" || st.SQLState() == "26000"
}
