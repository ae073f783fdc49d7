package sqlinbox

import (
	"database/sql/driver"
	"fmt"
	"strings"

	"github.com/txoutbox/txoutbox/dialect"
)

// detectDialect names the database behind db from what database/sql and
// sqlx expose: the driver name of a *sqlx.DB, or the driver type of a
// *sql.DB (pgx, pq, go-sql-driver/mysql, modernc.org/sqlite,
// mattn/go-sqlite3).
func detectDialect(db any) (dialect.Dialect, bool) {
	if d, ok := db.(interface{ DriverName() string }); ok {
		if dl, err := dialect.ByName(d.DriverName()); err == nil {
			return dl, true
		}
	}
	if d, ok := db.(interface{ Driver() driver.Driver }); ok {
		t := strings.ToLower(fmt.Sprintf("%T", d.Driver()))
		switch {
		case strings.Contains(t, "sqlite"):
			return dialect.SQLite, true
		case strings.Contains(t, "stdlib"), strings.Contains(t, "pq."), strings.Contains(t, "pgx"):
			return dialect.Postgres, true
		case strings.Contains(t, "mysql."):
			return dialect.MySQL, true
		}
	}
	return dialect.Dialect{}, false
}
