package inbox

import (
	"database/sql/driver"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// The inbox's SQL is four statements; they live here, per database, so that
// the table's shape is written down once for this package.

type flavor int

const (
	flavorPostgres flavor = iota + 1
	flavorSQLite
)

func (f flavor) String() string {
	if f == flavorSQLite {
		return "sqlite"
	}
	return "postgres"
}

// ErrUnknownDialect is returned for a dialect name other than "postgres" or
// "sqlite".
var ErrUnknownDialect = fmt.Errorf("%w: unknown inbox dialect", core.ErrInvalidOptions)

func flavorByName(name string) (flavor, error) {
	switch strings.ToLower(name) {
	case "postgres", "postgresql", "pgx", "pgx/v5", "pq":
		return flavorPostgres, nil
	case "sqlite", "sqlite3":
		return flavorSQLite, nil
	}
	return 0, fmt.Errorf("%w %q (want \"postgres\" or \"sqlite\")", ErrUnknownDialect, name)
}

// detectDialect names the database behind db from what database/sql and
// sqlx expose, or returns "".
func detectDialect(db any) string {
	if d, ok := db.(interface{ DriverName() string }); ok {
		if _, err := flavorByName(d.DriverName()); err == nil {
			return d.DriverName()
		}
	}
	if d, ok := db.(interface{ Driver() driver.Driver }); ok {
		t := strings.ToLower(fmt.Sprintf("%T", d.Driver()))
		switch {
		case strings.Contains(t, "sqlite"):
			return "sqlite"
		case strings.Contains(t, "stdlib"), strings.Contains(t, "pq."), strings.Contains(t, "pgx"):
			return "postgres"
		}
	}
	return ""
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// quoteTable validates a possibly schema-qualified table name and quotes it.
// The table name is the only text interpolated into the SQL.
func quoteTable(s string) (quoted, bare string, err error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return "", "", fmt.Errorf("%w: inbox table %q has more than two parts", core.ErrInvalidOptions, s)
	}
	q := make([]string, len(parts))
	for i, p := range parts {
		if !identRE.MatchString(p) {
			return "", "", fmt.Errorf("%w: inbox table %q (want [A-Za-z_][A-Za-z0-9_]{0,62}, optionally schema.table)", core.ErrInvalidOptions, s)
		}
		q[i] = `"` + p + `"`
	}
	return strings.Join(q, "."), parts[len(parts)-1], nil
}

// sqliteTimeFormat is how processed_at is stored on SQLite: UTC text of fixed
// width, so that text comparison is time order.
const sqliteTimeFormat = "2006-01-02T15:04:05.000Z"

const sqliteNow = `strftime('%Y-%m-%dT%H:%M:%fZ','now')`

type queries struct {
	flavor flavor
	insert string
	exists string
	delete string
	ddl    []string
}

func (q queries) timeArg(t time.Time) any {
	if q.flavor == flavorSQLite {
		return t.UTC().Format(sqliteTimeFormat)
	}
	return t
}

func buildQueries(f flavor, table string) (queries, error) {
	t, bare, err := quoteTable(table)
	if err != nil {
		return queries{}, err
	}
	idx := bare
	if len(idx) > 63-len("_processed_at") {
		idx = idx[:63-len("_processed_at")]
	}
	idx = `"` + idx + `_processed_at"`
	if f == flavorSQLite {
		return queries{
			flavor: f,
			insert: `INSERT INTO ` + t + ` (consumer, event_id, processed_at) VALUES (?, ?, ` + sqliteNow + `) ON CONFLICT DO NOTHING`,
			exists: `SELECT COUNT(*) FROM ` + t + ` WHERE consumer = ? AND event_id = ?`,
			delete: `DELETE FROM ` + t + ` WHERE (consumer, event_id) IN (SELECT consumer, event_id FROM ` + t + ` WHERE processed_at < ? LIMIT ?)`,
			ddl: []string{
				`CREATE TABLE IF NOT EXISTS ` + t + ` (
	consumer     TEXT NOT NULL,
	event_id     TEXT NOT NULL,
	processed_at TEXT NOT NULL DEFAULT (` + sqliteNow + `),
	PRIMARY KEY (consumer, event_id)
)`,
				`CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + t + ` (processed_at)`,
			},
		}, nil
	}
	// statement_timestamp(), not now(): a transaction may have waited on a
	// concurrent duplicate's lock before this statement ran.
	return queries{
		flavor: f,
		insert: `INSERT INTO ` + t + ` (consumer, event_id, processed_at) VALUES ($1, $2, statement_timestamp()) ON CONFLICT DO NOTHING`,
		exists: `SELECT COUNT(*) FROM ` + t + ` WHERE consumer = $1 AND event_id = $2`,
		delete: `DELETE FROM ` + t + ` WHERE (consumer, event_id) IN (SELECT consumer, event_id FROM ` + t + ` WHERE processed_at < $1 LIMIT $2)`,
		ddl: []string{
			`CREATE TABLE IF NOT EXISTS ` + t + ` (
	consumer     TEXT NOT NULL,
	event_id     TEXT NOT NULL,
	processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, event_id)
)`,
			`CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + t + ` (processed_at)`,
		},
	}, nil
}
