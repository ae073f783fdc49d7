package dialect

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sort"
	"strconv"
	"strings"
	"text/template"
)

// The migration files, per dialect and component, named NNNN_description.sql.
// A released file is never edited: changes go into a new, higher version.
//
//go:embed migrations
var migrationFiles embed.FS

// Components of the schema, each versioned on its own in the migrations
// table, so that one database can hold several outbox or inbox tables.
const (
	ComponentOutbox = "outbox"
	ComponentInbox  = "inbox"
	// ComponentLookup is the opt-in indexes for looking events up by ID
	// and by aggregate (MigrateOptions.LookupIndexes).
	ComponentLookup = "lookup"
)

// pgMigrateLockKey is the pg_advisory_xact_lock key that serializes Migrate
// across processes ("txoutbox" in ASCII).
const pgMigrateLockKey int64 = 0x74786f7574626f78

// MigrateOptions configures Migrate and Migrations.
type MigrateOptions struct {
	// Table is the outbox table. Default DefaultTable.
	Table string
	// InboxTable is the inbox table. Default DefaultInboxTable.
	InboxTable string
	// SkipInbox leaves the inbox table out (producer-only databases).
	SkipInbox bool
	// SkipOutbox leaves the outbox table out (consumer-only databases).
	SkipOutbox bool
	// SkipOrdered leaves out what ordered mode needs (ComponentOrdered: two
	// partial indexes on the outbox table, and on PostgreSQL the partition
	// lease tables). Ordered mode is on by default with brokers that keep
	// per-key order (Kafka, SNS FIFO), so the default migrations include
	// it; an outbox relayed only unordered may skip it to spare producers
	// one index entry per event.
	SkipOrdered bool
	// LookupIndexes adds indexes on event_id and (aggregate_id, id)
	// (ComponentLookup), for operators who look events up by ID or list an
	// aggregate's events often, as the console's events page does. Every
	// producer's insert then writes two more index entries, so they are
	// off by default.
	LookupIndexes bool
	// MigrationsTable records applied versions. Default
	// DefaultMigrationsTable.
	MigrationsTable string
	// Logger receives one line per applied migration. Default
	// slog.Default().
	Logger *slog.Logger
}

// Migration is one versioned schema change, with the table names already
// substituted.
type Migration struct {
	// Component is ComponentOutbox, ComponentOrdered or ComponentInbox.
	Component string
	// Table is the table the migration is for, as configured.
	Table string
	// Version orders the migrations of a component, from 1.
	Version int
	// Name is the file name without its version and extension.
	Name string
	// SQL is the statements to run.
	SQL string
}

// Migrations returns the migrations of d for opts, in the order Migrate
// applies them, for users who run their own migration tool (print SQL and
// feed it to goose, Atlas, Flyway...).
func Migrations(d Dialect, opts MigrateOptions) ([]Migration, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	var out []Migration
	add := func(component, table, def string) error {
		if table == "" {
			table = def
		}
		id, err := ValidateIdentifier(table)
		if err != nil {
			return err
		}
		ms, err := d.render(component, id)
		if err != nil {
			return err
		}
		out = append(out, ms...)
		return nil
	}
	if !opts.SkipOutbox {
		if err := add(ComponentOutbox, opts.Table, DefaultTable); err != nil {
			return nil, err
		}
		if !opts.SkipOrdered {
			if err := add(ComponentOrdered, opts.Table, DefaultTable); err != nil {
				return nil, err
			}
		}
		if opts.LookupIndexes {
			if err := add(ComponentLookup, opts.Table, DefaultTable); err != nil {
				return nil, err
			}
		}
	}
	if !opts.SkipInbox {
		if err := add(ComponentInbox, opts.InboxTable, DefaultInboxTable); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (d Dialect) render(component string, id Identifier) ([]Migration, error) {
	dir := path.Join("migrations", d.Name(), component)
	entries, err := fs.ReadDir(migrationFiles, dir)
	if err != nil {
		return nil, fmt.Errorf("dialect: no %s migrations for %s: %w", component, d.Name(), err)
	}
	schemaPrefix := ""
	if id.Schema != "" {
		schemaPrefix = d.quote(id.Schema) + "."
	}
	vars := map[string]string{
		"table":         d.qualified(id),
		"table_name":    d.quote(id.Name),
		"schema_prefix": schemaPrefix,
	}
	funcs := template.FuncMap{"index": func(suffix string) string { return d.quote(indexName(id.Name, suffix)) }}
	for k, v := range vars {
		funcs[k] = func() string { return v }
	}
	var ms []Migration
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".sql") {
			continue
		}
		num, rest, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("dialect: migration file %s/%s is not named NNNN_name.sql", dir, name)
		}
		src, err := fs.ReadFile(migrationFiles, path.Join(dir, name))
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(name).Funcs(funcs).Parse(string(src))
		if err != nil {
			return nil, fmt.Errorf("dialect: migration %s/%s: %w", dir, name, err)
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, nil); err != nil {
			return nil, fmt.Errorf("dialect: migration %s/%s: %w", dir, name, err)
		}
		ms = append(ms, Migration{Component: component, Table: id.String(), Version: v, Name: rest, SQL: b.String()})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := range ms {
		if ms[i].Version != i+1 {
			return nil, fmt.Errorf("dialect: %s migrations of %s skip or repeat version %d", component, d.Name(), i+1)
		}
	}
	return ms, nil
}

// Migrate brings the outbox (with what ordered mode needs, unless
// SkipOrdered) and inbox tables of opts up to date on db and
// records each applied version in the migrations table. It is idempotent,
// and safe to run from several processes at once: everything happens in one
// transaction that first takes a lock (pg_advisory_xact_lock on PostgreSQL,
// BEGIN IMMEDIATE on SQLite), so a second caller waits and then finds
// nothing left to do. A failing migration rolls back all of them. On MySQL,
// whose DDL is not transactional, a named lock (GET_LOCK) serializes
// migrators and each migration is recorded once it has run.
func Migrate(ctx context.Context, db *sql.DB, d Dialect, opts MigrateOptions) error {
	ms, err := Migrations(d, opts)
	if err != nil {
		return err
	}
	return d.applyMigrations(ctx, db, ms, opts)
}

// applyMigrations applies those of ms not yet recorded in the migrations
// table, in one transaction, serialized across processes, and records them:
// the work of Migrate and of the partitioned outbox's migration.
func (d Dialect) applyMigrations(ctx context.Context, db *sql.DB, ms []Migration, opts MigrateOptions) (err error) {
	if opts.MigrationsTable == "" {
		opts.MigrationsTable = DefaultMigrationsTable
	}
	mid, err := ValidateIdentifier(opts.MigrationsTable)
	if err != nil {
		return err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("dialect: migrate: %w", err)
	}
	defer conn.Close()

	if d.kind == kindMySQL {
		return d.applyMySQL(ctx, conn, mid, ms, log)
	}

	// database/sql's BeginTx cannot say BEGIN IMMEDIATE, which SQLite needs
	// so that two migrators do not both read and then both try to write.
	begin, commit, rollback := "BEGIN", "COMMIT", "ROLLBACK"
	if d.kind == kindSQLite {
		begin = "BEGIN IMMEDIATE"
	}
	if _, err := conn.ExecContext(ctx, begin); err != nil {
		return fmt.Errorf("dialect: migrate: begin: %w", err)
	}
	defer func() {
		if err != nil {
			if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), rollback); rerr != nil {
				err = errors.Join(err, fmt.Errorf("dialect: migrate: rollback: %w", rerr))
				// database/sql does not know about this transaction: make
				// it discard the connection rather than pool it mid-transaction.
				_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			}
		}
	}()
	if d.kind == kindPostgres {
		if _, err := conn.ExecContext(ctx, d.rebind("SELECT pg_advisory_xact_lock(?)"), pgMigrateLockKey); err != nil {
			return fmt.Errorf("dialect: migrate: lock: %w", err)
		}
	}
	mt := d.qualified(mid)
	ts, now := "TIMESTAMPTZ", "now()"
	if d.kind == kindSQLite {
		ts, now = "TEXT", "("+sqliteNow+")"
	}
	if _, err := conn.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+mt+" ("+
		"component TEXT NOT NULL, table_name TEXT NOT NULL, version INTEGER NOT NULL, name TEXT NOT NULL, "+
		"applied_at "+ts+" NOT NULL DEFAULT "+now+", PRIMARY KEY (component, table_name, version))"); err != nil {
		return fmt.Errorf("dialect: migrate: create %s: %w", mid, err)
	}
	applied, err := readApplied(ctx, conn, mt, mid)
	if err != nil {
		return err
	}
	record := d.rebind("INSERT INTO " + mt + " (component, table_name, version, name) VALUES (?, ?, ?, ?)")
	var done []Migration
	for _, m := range ms {
		if applied[m.Component+"\x00"+m.Table+"\x00"+strconv.Itoa(m.Version)] {
			continue
		}
		if _, err := conn.ExecContext(ctx, m.SQL); err != nil {
			return fmt.Errorf("dialect: migration %s %04d_%s on %s: %w", m.Component, m.Version, m.Name, m.Table, err)
		}
		if _, err := conn.ExecContext(ctx, record, m.Component, m.Table, m.Version, m.Name); err != nil {
			return fmt.Errorf("dialect: record migration %s %d: %w", m.Component, m.Version, err)
		}
		done = append(done, m)
	}
	if _, err := conn.ExecContext(ctx, commit); err != nil {
		return fmt.Errorf("dialect: migrate: commit: %w", err)
	}
	for _, m := range done {
		log.Info("txoutbox: applied migration", "dialect", d.Name(), "component", m.Component,
			"table", m.Table, "version", m.Version, "name", m.Name)
	}
	return nil
}

// readApplied returns the versions recorded in the migrations table mt.
func readApplied(ctx context.Context, conn *sql.Conn, mt string, mid Identifier) (map[string]bool, error) {
	applied := map[string]bool{}
	rows, err := conn.QueryContext(ctx, "SELECT component, table_name, version FROM "+mt)
	if err != nil {
		return nil, fmt.Errorf("dialect: migrate: read %s: %w", mid, err)
	}
	for rows.Next() {
		var c, t string
		var v int
		if err := rows.Scan(&c, &t, &v); err != nil {
			rows.Close()
			return nil, fmt.Errorf("dialect: migrate: read %s: %w", mid, err)
		}
		applied[c+"\x00"+t+"\x00"+strconv.Itoa(v)] = true
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("dialect: migrate: read %s: %w", mid, err)
	}
	return applied, nil
}

// mysqlMigrateLock is the SQL of the GET_LOCK name that serializes
// Migrate across processes on MySQL, with one parameter: the migrations
// table's schema, or NULL for the connection's database. Named locks are
// the server's, so the name carries the database: migrators of different
// databases on one server do not wait for each other. A hash keeps it
// within GET_LOCK's 64 characters.
const mysqlMigrateLock = "CONCAT('txoutbox_migrate:', LEFT(SHA1(COALESCE(?, DATABASE())), 40))"

// applyMySQL is applyMigrations on MySQL, whose DDL commits as it runs, so
// no transaction can hold the migrations: a named lock (GET_LOCK, held by
// conn's session) serializes migrators, and each migration is recorded as
// soon as it has run. A migration that fails half-way leaves the
// statements before the failing one applied and is not recorded; its
// statements are CREATE ... IF NOT EXISTS where MySQL has that form, so
// running it again after the fix finishes it.
func (d Dialect) applyMySQL(ctx context.Context, conn *sql.Conn, mid Identifier, ms []Migration, log *slog.Logger) error {
	var schema any
	if mid.Schema != "" {
		schema = mid.Schema
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+mysqlMigrateLock+", 600)", schema).Scan(&got); err != nil {
		return fmt.Errorf("dialect: migrate: lock: %w", err)
	}
	if got.Int64 != 1 {
		return fmt.Errorf("dialect: migrate: another migration of this database held its lock for 10 minutes")
	}
	defer func() {
		// A session that cannot release its lock is closed, which does.
		if _, err := conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK("+mysqlMigrateLock+")", schema); err != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	mt := d.qualified(mid)
	if _, err := conn.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+mt+" ("+
		"component VARCHAR(64) NOT NULL, table_name VARCHAR(255) NOT NULL, version INT NOT NULL, name VARCHAR(255) NOT NULL, "+
		"applied_at DATETIME(6) NOT NULL DEFAULT ("+mysqlNow+"), PRIMARY KEY (component, table_name, version))"+
		" ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin"); err != nil {
		return fmt.Errorf("dialect: migrate: create %s: %w", mid, err)
	}
	applied, err := readApplied(ctx, conn, mt, mid)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if applied[m.Component+"\x00"+m.Table+"\x00"+strconv.Itoa(m.Version)] {
			continue
		}
		// The driver runs one statement per call unless the DSN allows
		// more (multiStatements), which txoutbox does not ask of it.
		for _, stmt := range splitStatements(m.SQL) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("dialect: migration %s %04d_%s on %s: %w", m.Component, m.Version, m.Name, m.Table, err)
			}
		}
		if _, err := conn.ExecContext(ctx, "INSERT INTO "+mt+" (component, table_name, version, name) VALUES (?, ?, ?, ?)",
			m.Component, m.Table, m.Version, m.Name); err != nil {
			return fmt.Errorf("dialect: record migration %s %d: %w", m.Component, m.Version, err)
		}
		log.Info("txoutbox: applied migration", "dialect", d.Name(), "component", m.Component,
			"table", m.Table, "version", m.Version, "name", m.Name)
	}
	return nil
}

// splitStatements splits a migration file of this package into its
// statements: each ends with a semicolon at the end of a line, and lines
// starting with -- are comments.
func splitStatements(src string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(src, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(t, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
