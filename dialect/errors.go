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
// names the migration to run.
func CheckMigrated(err error, table Identifier) error {
	if !IsUndefinedTable(err) || errors.Is(err, core.ErrNotMigrated) {
		return err
	}
	return fmt.Errorf("%w: table %s: %w", core.ErrNotMigrated, table, err)
}
