// Package dialect builds the SQL that txoutbox's SQL stores run, one Dialect
// value per database: Postgres, MySQL (MySQL 8.0 and MariaDB 10.6 or later)
// and SQLite.
//
// A Dialect knows only SQL text, argument encoding and the schema; it holds
// no connection. Every SQL adapter (database/sql and sqlx in adapters/sqlx,
// GORM in adapters/gorm) runs the same statements from the same Queries, so
// that a fix to a query reaches all of them.
//
// Statements come with their arguments: a Queries method returns the SQL text
// and the []any to pass with it. Arguments are plain strings, integers and
// booleans (lists and records travel as JSON text), so that any database/sql
// driver of the database and any ORM's raw-SQL call can run them.
//
// The only text ever interpolated into SQL is a table name, and only after
// ValidateIdentifier accepted it: every other value is a bind argument.
// Names are quoted in SQL (double quotes, backticks on MySQL), so reserved
// words work and names are case-sensitive as written.
//
// # Schema
//
// Migrate creates the tables from the embedded, versioned files in
// migrations/<dialect>/<component>/NNNN_name.sql and records them in
// txoutbox_migrations; Migrations returns the same SQL for other migration
// tools. The outbox table has a partial index for the claim (next_attempt_at,
// id WHERE published_at IS NULL AND dead_at IS NULL), so that the claim stays
// fast however many published rows retention keeps, one for cleanup on
// published_at, and one on dead rows.
//
// There is deliberately no unique index on event_id: every producer
// transaction would maintain one more B-tree, keyed by a UUID, for a
// guarantee nobody needs there. IDs are UUIDv7, unique by construction, and
// duplicates are absorbed where they matter, by the consumers' inbox
// (primary key (consumer, event_id)). Looking an event up by ID therefore
// scans; add an index yourself if your operators do it often.
//
// On MySQL and MariaDB, timestamps are DATETIME(6) in UTC, always produced
// by UTC_TIMESTAMP(6) in SQL or TimeArg in Go, whatever the session's time
// zone; JSON columns are LONGTEXT (txoutbox validates the JSON before it
// writes). InnoDB has no partial indexes: the claim's index is (published_at,
// dead_at, next_attempt_at, id), whose leading NULLs hold exactly the
// pending rows, so the claim seeks past every published row kept for
// retention (see docs/mysql.md for the measurement). Lists of Seqs travel as
// one JSON argument joined through JSON_TABLE. There is no UPDATE ...
// RETURNING and no data-modifying WITH: a claim locks its rows with SELECT
// ... FOR UPDATE SKIP LOCKED under READ COMMITTED (no gap locks, so
// producers never wait behind a claim) and marks them when the batch is
// done; Enqueue reads the assigned Seqs back with a second statement.
//
// On SQLite, timestamps are TEXT in one fixed UTC format with milliseconds
// ("2006-01-02T15:04:05.000Z"), always produced by
// strftime('%Y-%m-%dT%H:%M:%fZ', ...) in SQL or TimeArg in Go, so comparing
// the text compares the times; JSON columns are TEXT. SQLite claims are
// leases (ClaimLease) kept in an extra claimed_until column.
package dialect

import (
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidIdentifier is wrapped by every error that rejects a table name.
var ErrInvalidIdentifier = errors.New("dialect: invalid SQL identifier")

// ErrUnknownDialect is returned by ByName for a name it does not know.
var ErrUnknownDialect = errors.New("dialect: unknown dialect")

// Default table names.
const (
	DefaultTable           = "outbox_events"
	DefaultInboxTable      = "processed_events"
	DefaultMigrationsTable = "txoutbox_migrations"
)

// Placeholder is the style of bind parameters in SQL text.
type Placeholder int

const (
	// Dollar numbers parameters: $1, $2, ... (PostgreSQL drivers).
	Dollar Placeholder = iota + 1
	// Question marks every parameter with ?: SQLite, MySQL, and ORMs such as
	// GORM that rewrite ? themselves.
	Question
)

// ClaimMode says how a dialect keeps a claimed batch away from other claims.
type ClaimMode int

const (
	// ClaimRowLocks: the claim is a transaction holding row locks (SELECT
	// ... FOR UPDATE SKIP LOCKED) until Commit or Release. A crashed relay's
	// locks vanish with its connection.
	ClaimRowLocks ClaimMode = iota + 1
	// ClaimLease: the claim is one short write that stamps claimed_until on
	// the rows; no transaction stays open while the batch is published, so
	// producers are not blocked. A crashed relay's rows are claimable again
	// once the lease expires.
	ClaimLease
)

type kind int

const (
	kindPostgres kind = iota + 1
	kindSQLite
	kindMySQL
)

// Dialect is one database's flavour of SQL. It is a small comparable value;
// use Postgres, MySQL or SQLite, optionally with WithPlaceholders.
type Dialect struct {
	kind kind
	ph   Placeholder
}

var (
	// Postgres is PostgreSQL (11 or later; 13+ for gen_random_uuid in the
	// benchmarks only) with $n placeholders.
	Postgres = Dialect{kind: kindPostgres, ph: Dollar}
	// SQLite is SQLite 3.35 or later (RETURNING, UPDATE ... FROM) with ?
	// placeholders.
	SQLite = Dialect{kind: kindSQLite, ph: Question}
	// MySQL is MySQL 8.0.13 or later and MariaDB 10.6 or later (SKIP
	// LOCKED, JSON_TABLE, expression defaults) with ? placeholders, on
	// InnoDB. Its SQL keeps to what both document; the tests run it on
	// MariaDB.
	MySQL = Dialect{kind: kindMySQL, ph: Question}
)

// ByName returns the dialect for a dialect or database/sql driver name:
// "postgres", "postgresql", "pgx", "pq"; "mysql", "mariadb"; and "sqlite",
// "sqlite3".
func ByName(name string) (Dialect, error) {
	switch strings.ToLower(name) {
	case "postgres", "postgresql", "pgx", "pgx/v5", "pq", "cloudsqlpostgres":
		return Postgres, nil
	case "mysql", "mariadb":
		return MySQL, nil
	case "sqlite", "sqlite3":
		return SQLite, nil
	}
	return Dialect{}, fmt.Errorf("%w %q", ErrUnknownDialect, name)
}

// Name returns "postgres", "mysql" or "sqlite", or "" for the zero Dialect.
func (d Dialect) Name() string {
	switch d.kind {
	case kindPostgres:
		return "postgres"
	case kindMySQL:
		return "mysql"
	case kindSQLite:
		return "sqlite"
	}
	return ""
}

// String returns Name.
func (d Dialect) String() string { return d.Name() }

// DataModifyingWith reports whether the dialect runs INSERTs inside a WITH
// clause of another statement (PostgreSQL), which Queries.InsertWith needs.
func (d Dialect) DataModifyingWith() bool { return d.kind == kindPostgres }

// ClaimMarks reports whether a claim marks its rows published in the
// statement that claims them (Queries.ClaimMarked, PostgreSQL), so that its
// outcome only undoes the failures; elsewhere the outcome marks them.
func (d Dialect) ClaimMarks() bool { return d.kind == kindPostgres }

// ReturnsInserted reports whether Queries.Insert returns the rows it wrote
// (INSERT ... RETURNING); where it does not (MySQL), read them back with
// Queries.InsertedRows.
func (d Dialect) ReturnsInserted() bool { return d.kind != kindMySQL }

// ClaimTxOptions returns the isolation a claim's transaction needs, nil for
// the driver's default. On MySQL it is READ COMMITTED: under InnoDB's
// default REPEATABLE READ the claim's locking read would also lock the gap
// after the last due row, where every producer's new row goes, and
// producers would wait for each batch to be published.
func (d Dialect) ClaimTxOptions() *sql.TxOptions {
	if d.kind == kindMySQL {
		return &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return nil
}

// IsZero reports whether d is the zero Dialect, i.e. none was chosen.
func (d Dialect) IsZero() bool { return d.kind == 0 }

// Placeholders returns the bind parameter style of the SQL d builds.
func (d Dialect) Placeholders() Placeholder { return d.ph }

// WithPlaceholders returns d building SQL with placeholder style p. GORM
// takes ? on every database and rewrites it, so its adapter uses
// Postgres.WithPlaceholders(Question).
func (d Dialect) WithPlaceholders(p Placeholder) Dialect {
	d.ph = p
	return d
}

// ClaimMode says how claims are isolated from each other on d.
func (d Dialect) ClaimMode() ClaimMode {
	if d.kind == kindSQLite {
		return ClaimLease
	}
	return ClaimRowLocks
}

// MaxConcurrency is the number of concurrent claims worth running on d:
// 0 means no limit of the dialect's own; SQLite has one writer, so 1.
func (d Dialect) MaxConcurrency() int {
	if d.kind == kindSQLite {
		return 1
	}
	return 0
}

func (d Dialect) check() error {
	if d.kind == 0 {
		return fmt.Errorf("%w: zero Dialect (use dialect.Postgres, dialect.MySQL or dialect.SQLite)", ErrUnknownDialect)
	}
	return nil
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Identifier is a validated, possibly schema-qualified table name.
type Identifier struct {
	// Schema is empty when the name is not qualified.
	Schema string
	// Name is the table's own name.
	Name string
}

// ValidateIdentifier checks that s is a table name txoutbox may put into SQL:
// [A-Za-z_][A-Za-z0-9_]{0,62}, optionally qualified as schema.table with a
// schema of the same form. Anything else (quotes, spaces, semicolons,
// comments, a third part) is rejected with an error wrapping
// ErrInvalidIdentifier.
func ValidateIdentifier(s string) (Identifier, error) {
	schema, name, qualified := strings.Cut(s, ".")
	if !qualified {
		schema, name = "", s
	}
	if (qualified && !identRE.MatchString(schema)) || !identRE.MatchString(name) {
		return Identifier{}, fmt.Errorf("%w: %q (want [A-Za-z_][A-Za-z0-9_]{0,62}, optionally schema.table)", ErrInvalidIdentifier, s)
	}
	return Identifier{Schema: schema, Name: name}, nil
}

// String returns the identifier as it was written, unquoted.
func (id Identifier) String() string {
	if id.Schema == "" {
		return id.Name
	}
	return id.Schema + "." + id.Name
}

// quote quotes one validated name part. Quoting keeps reserved words such as
// "order" usable; names are therefore case-sensitive as written. The
// validation above leaves no character that would need escaping.
func (d Dialect) quote(part string) string {
	if d.kind == kindMySQL {
		return "`" + part + "`"
	}
	return `"` + part + `"`
}

// Quote returns id quoted for d's SQL (schema-qualified when it has a
// schema), for statements of your own next to txoutbox's.
func (d Dialect) Quote(id Identifier) string { return d.qualified(id) }

// qualified returns the quoted, schema-qualified table name.
func (d Dialect) qualified(id Identifier) string {
	if id.Schema == "" {
		return d.quote(id.Name)
	}
	return d.quote(id.Schema) + "." + d.quote(id.Name)
}

// indexName derives an index name from a table name that fits the 63-byte
// identifier limit (64 on MySQL) even for the longest table names, so that
// PostgreSQL never truncates two index names of one table to the same
// string.
func indexName(table, suffix string) string {
	if max := 63 - len(suffix) - 1; len(table) > max {
		table = table[:max]
	}
	return table + "_" + suffix
}

// rebind rewrites the ? placeholders of q (written by this package, so no ?
// appears in literals) to the dialect's style.
func (d Dialect) rebind(q string) string {
	if d.ph != Dollar {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 16)
	writeDollars(&b, q, 0)
	return b.String()
}

// writeDollars writes q to b with its ? placeholders numbered $n+1, $n+2, ...
func writeDollars(b *strings.Builder, q string, n int) {
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(q[i])
	}
}

// sqliteTimeFormat is how SQLite columns store timestamps: UTC, fixed width,
// milliseconds, exactly what strftime('%Y-%m-%dT%H:%M:%fZ') produces, so
// that text comparison orders them correctly.
const sqliteTimeFormat = "2006-01-02T15:04:05.000Z"

// sqliteNow is the SQL for the current time in sqliteTimeFormat.
const sqliteNow = `strftime('%Y-%m-%dT%H:%M:%fZ','now')`

// now is the SQL expression for the database's current time. PostgreSQL's
// statement_timestamp() is the start of the statement, not of the
// transaction (now()), which matters for statements that run in a claim's
// transaction after a long publish. MySQL's UTC_TIMESTAMP(6) is the
// statement's start too, in UTC whatever the session's time zone.
func (d Dialect) now() string {
	switch d.kind {
	case kindSQLite:
		return sqliteNow
	case kindMySQL:
		return mysqlNow
	}
	return "statement_timestamp()"
}

// mysqlNow is the current time on MySQL, in UTC with microseconds.
const mysqlNow = "UTC_TIMESTAMP(6)"

// mysqlTimeFormat is how a time travels to a MySQL DATETIME(6) column: UTC
// text, so that the driver's loc setting cannot shift it.
const mysqlTimeFormat = "2006-01-02 15:04:05.999999"

// TimeArg returns t as the bind argument the dialect compares timestamps
// with: a time.Time on PostgreSQL, UTC text on MySQL (microseconds) and
// SQLite (sqliteTimeFormat, which truncates to milliseconds).
func (d Dialect) TimeArg(t time.Time) any {
	switch d.kind {
	case kindSQLite:
		return t.UTC().Format(sqliteTimeFormat)
	case kindMySQL:
		return t.UTC().Format(mysqlTimeFormat)
	}
	return t
}

// later is the SQL of the database's now plus a bind parameter of
// microseconds.
func (d Dialect) later() string {
	if d.kind == kindMySQL {
		return mysqlNow + " + INTERVAL ? MICROSECOND"
	}
	return d.now() + " + CAST(? AS bigint) * interval '1 microsecond'"
}
