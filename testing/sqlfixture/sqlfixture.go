// Package sqlfixture gives conformance tests a fresh database with the
// txoutbox schema, for every database txoutbox supports, and the
// outboxtest.StoreFixture of a store of yours on it: Enqueue, Get,
// Backdate, RetryDead and Crash, written once here against the schema so
// that an adapter's author writes none of them.
//
//	func TestMyStore(t *testing.T) {
//		outboxtest.RunStore(t, func(t *testing.T) *outboxtest.StoreFixture {
//			db := sqlfixture.Open(t, os.Getenv("DATABASE_URL"), sqlfixture.Options{})
//			store := mystore.New(db.DB, db.Table.String()) // your store, on db.DB
//			return db.StoreFixture(store)
//		})
//	}
//
// Open takes a PostgreSQL URL (postgres://) or a MySQL/MariaDB URL
// (mysql://), on whose server it makes a database per fixture, or
// "sqlite:" (a file in the test's temporary directory). A MySQL database
// is dropped when its test ends; a PostgreSQL one is emptied, renamed and
// given to the next test of the process, or dropped a few seconds later
// (CreatePostgresDatabase).
package sqlfixture

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	_ "modernc.org/sqlite"             // the "sqlite" database/sql driver

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/mysqldsn"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// SQLiteClaimLease is DB.ClaimLease on SQLite: longer than any batch of
// the suites takes to publish and mark, even with four relays queueing for
// SQLite's one writer under the race detector on a loaded machine (2s and
// then 5s were not: a lease ran out and a batch was claimed twice). Crash
// ends the leases at once, so the crash test does not wait for them.
const SQLiteClaimLease = time.Minute

// DefaultOrdersTable is the default Options.OrdersTable.
const DefaultOrdersTable = "txoutbox_fixture_orders"

// MaxOpenConns caps the pool of a PostgreSQL fixture, so that parallel
// subtests do not exhaust the server's max_connections.
const MaxOpenConns = 16

// SizePool caps db at MaxOpenConns connections and keeps as many idle.
// database/sql keeps 2 idle by default: a test with more concurrent users
// than that closes a connection after nearly every transaction and opens
// another, and each new PostgreSQL connection forks and initialises a
// server process (a tenth of PostgreSQL's CPU in a perf profile of two
// test packages).
func SizePool(db *sql.DB) {
	db.SetMaxOpenConns(MaxOpenConns)
	db.SetMaxIdleConns(MaxOpenConns)
}

// Options configures Open. Zero fields take their defaults.
type Options struct {
	// Table is the outbox table. Default dialect.DefaultTable.
	Table string
	// SkipInbox leaves the inbox table out.
	SkipInbox bool
	// Partitioned, when set, creates the outbox partitioned by day
	// (dialect.MigratePartitioned, PostgreSQL only); its Table defaults to
	// Table.
	Partitioned *dialect.PartitionOptions
	// OrdersTable is the table of the producers' business rows, which the
	// fixture creates: every Enqueue writes a row to it. Default
	// DefaultOrdersTable.
	OrdersTable string
	// OrdersColumn names its count column. Default "events".
	OrdersColumn string
	// Logger receives the migrations' logs. Default: none.
	Logger *slog.Logger
}

// DB is one fresh, migrated database for one test, with an orders table
// for the producers' business rows.
type DB struct {
	// DB is the database; build the store under test on it.
	DB *sql.DB
	// Dialect is the database's dialect.
	Dialect dialect.Dialect
	// Table is the outbox table.
	Table dialect.Identifier
	// ClaimLease is the claim lease to give a store that leases rows
	// (SQLite): 0 on PostgreSQL. StoreFixture reports it to the suite.
	ClaimLease time.Duration

	q      *dialect.Queries
	orders string             // INSERT of a business row
	box    *sqlxoutbox.Outbox // writes the events
}

// Open makes a fresh database for the test from dsn: a PostgreSQL URL
// (postgres:// or postgresql://, a role that may CREATE DATABASE), a MySQL
// or MariaDB URL (mysql://, a user that may CREATE DATABASE) or "sqlite:"
// (a file in t.TempDir()); it migrates it, and closes it when the test
// ends (see the package doc for what becomes of the database). It fails
// the test on any error.
func Open(t testing.TB, dsn string, opts Options) *DB {
	t.Helper()
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		db, err := sql.Open("pgx", CreatePostgresDatabase(t, dsn))
		if err != nil {
			t.Fatalf("sqlfixture: open postgres: %v", err)
		}
		SizePool(db)
		t.Cleanup(func() { db.Close() })
		return New(t, db, dialect.Postgres, opts)
	case mysqldsn.IsURL(dsn):
		db, err := sql.Open("mysql", CreateMySQLDatabase(t, dsn))
		if err != nil {
			t.Fatalf("sqlfixture: open mysql: %v", err)
		}
		SizePool(db)
		t.Cleanup(func() { db.Close() })
		return New(t, db, dialect.MySQL, opts)
	case dsn == "sqlite:" || dsn == "sqlite":
		db, err := sql.Open("sqlite", SQLiteDSN(filepath.Join(t.TempDir(), "outbox.db")))
		if err != nil {
			t.Fatalf("sqlfixture: open sqlite: %v", err)
		}
		t.Cleanup(func() { db.Close() })
		return New(t, db, dialect.SQLite, opts)
	}
	t.Fatalf("sqlfixture: DSN %q: want postgres://..., mysql://... or sqlite:", redact(dsn))
	return nil
}

// SQLiteDSN is how txoutbox opens SQLite (see the sqlxoutbox package
// documentation): WAL, a busy timeout, and BEGIN IMMEDIATE so that
// producers queue for the lock.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate"
}

// New migrates db, an empty database of d that the test owns, and returns
// its fixture.
func New(t testing.TB, db *sql.DB, d dialect.Dialect, opts Options) *DB {
	t.Helper()
	ctx := context.Background()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.OrdersColumn == "" {
		opts.OrdersColumn = "events"
	}
	table := opts.Table
	if p := opts.Partitioned; p != nil {
		po := *p
		if po.Table == "" {
			po.Table = opts.Table
		}
		if po.Logger == nil {
			po.Logger = opts.Logger
		}
		table = po.Table
		if err := dialect.MigratePartitioned(ctx, db, d, po); err != nil {
			t.Fatalf("sqlfixture: MigratePartitioned: %v", err)
		}
		if !opts.SkipInbox {
			if err := dialect.Migrate(ctx, db, d, dialect.MigrateOptions{SkipOutbox: true, Logger: opts.Logger}); err != nil {
				t.Fatalf("sqlfixture: migrate inbox: %v", err)
			}
		}
	} else if err := dialect.Migrate(ctx, db, d, dialect.MigrateOptions{Table: table, SkipInbox: opts.SkipInbox, Logger: opts.Logger}); err != nil {
		t.Fatalf("sqlfixture: migrate: %v", err)
	}
	opts.Table = table
	return Attach(t, db, d, opts)
}

// Attach returns the fixture of db, whose outbox table opts.Table exists
// already (made by another migration path, such as GORM's AutoMigrate): it
// only creates the orders table. Partitioned and SkipInbox are ignored.
func Attach(t testing.TB, db *sql.DB, d dialect.Dialect, opts Options) *DB {
	t.Helper()
	ctx := context.Background()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.OrdersColumn == "" {
		opts.OrdersColumn = "events"
	}
	if opts.OrdersTable == "" {
		opts.OrdersTable = DefaultOrdersTable
	}
	ot, err := dialect.ValidateIdentifier(opts.OrdersTable)
	if err != nil {
		t.Fatal(err)
	}
	table := opts.Table
	q, err := d.Queries(table)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+d.Quote(ot)+" (id VARCHAR(64) PRIMARY KEY, "+opts.OrdersColumn+" INTEGER NOT NULL)"); err != nil {
		t.Fatalf("sqlfixture: create orders: %v", err)
	}
	box, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Dialect: d, Table: table, Logger: opts.Logger})
	if err != nil {
		t.Fatal(err)
	}
	insert := "INSERT INTO " + d.Quote(ot) + " (id, " + opts.OrdersColumn + ") VALUES (?, ?)"
	if d.Placeholders() == dialect.Dollar {
		insert = "INSERT INTO " + d.Quote(ot) + " (id, " + opts.OrdersColumn + ") VALUES ($1, $2)"
	}
	f := &DB{DB: db, Dialect: d, Table: q.Table(), q: q, orders: insert, box: box}
	if d.ClaimMode() == dialect.ClaimLease {
		f.ClaimLease = SQLiteClaimLease
	}
	return f
}

// Enqueue writes one orders row and the events in one transaction, with
// sqlxoutbox, and commits, or rolls back when commit is false.
func (f *DB) Enqueue(ctx context.Context, evs []core.Event, commit bool) error {
	tx, err := f.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := f.order(ctx, tx, len(evs)); err != nil {
		return err
	}
	if err := f.box.Enqueue(ctx, tx, evs...); err != nil {
		return err
	}
	if !commit {
		return tx.Rollback()
	}
	return tx.Commit()
}

// EnqueueThenCommit writes one orders row, tries to enqueue the events in
// the same transaction, and commits whatever the enqueue returned.
func (f *DB) EnqueueThenCommit(ctx context.Context, evs []core.Event) (enqueueErr, commitErr error) {
	tx, err := f.DB.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	if err := f.order(ctx, tx, len(evs)); err != nil {
		return nil, err
	}
	enqueueErr = f.box.Enqueue(ctx, tx, evs...)
	return enqueueErr, tx.Commit()
}

func (f *DB) order(ctx context.Context, tx *sql.Tx, n int) error {
	_, err := tx.ExecContext(ctx, f.orders, randomID(), n)
	return err
}

// Get returns the stored event with the given ID.
func (f *DB) Get(ctx context.Context, id string) (core.Event, error) { return f.box.Get(ctx, id) }

// RetryDead re-queues the dead event with the given ID.
func (f *DB) RetryDead(ctx context.Context, id string) error {
	n, err := f.box.RetryDead(ctx, dialect.DeadFilter{EventIDs: []string{id}})
	if err == nil && n != 1 {
		err = fmt.Errorf("sqlfixture: re-queue %s: %d rows", id, n)
	}
	return err
}

// Backdate moves the created_at, published_at, next_attempt_at and dead_at
// of the event id back by age, and fails unless exactly one row changed.
// On a partitioned table PostgreSQL moves the row to an older partition.
func (f *DB) Backdate(ctx context.Context, id string, age time.Duration) error {
	return Backdate(ctx, f.DB, f.Dialect, f.Table.String(), id, age)
}

// Execer is what Backdate needs of a database: *sql.DB and *sqlx.DB are
// ones.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Backdate is DB.Backdate on any database handle and outbox table.
func Backdate(ctx context.Context, db Execer, d dialect.Dialect, table, id string, age time.Duration) error {
	tid, err := dialect.ValidateIdentifier(table)
	if err != nil {
		return err
	}
	var query string
	var args []any
	switch {
	case d == dialect.MySQL:
		query = "UPDATE " + d.Quote(tid) + " SET created_at = created_at - INTERVAL ? MICROSECOND," +
			" published_at = published_at - INTERVAL ? MICROSECOND, dead_at = dead_at - INTERVAL ? MICROSECOND," +
			" next_attempt_at = next_attempt_at - INTERVAL ? MICROSECOND WHERE event_id = ?"
		us := age.Microseconds()
		args = []any{us, us, us, us, id}
	case d.ClaimMode() == dialect.ClaimRowLocks:
		query = "UPDATE " + d.Quote(tid) + " SET created_at = created_at - $1 * interval '1 microsecond'," +
			" published_at = published_at - $1 * interval '1 microsecond', dead_at = dead_at - $1 * interval '1 microsecond'," +
			" next_attempt_at = next_attempt_at - $1 * interval '1 microsecond'" +
			" WHERE event_id = $2"
		args = []any{age.Microseconds(), id}
	default:
		mod := fmt.Sprintf("-%.3f seconds", age.Seconds())
		query = "UPDATE " + d.Quote(tid) + " SET created_at = strftime('%Y-%m-%dT%H:%M:%fZ', created_at, ?1)," +
			" published_at = strftime('%Y-%m-%dT%H:%M:%fZ', published_at, ?1), dead_at = strftime('%Y-%m-%dT%H:%M:%fZ', dead_at, ?1)," +
			" next_attempt_at = strftime('%Y-%m-%dT%H:%M:%fZ', next_attempt_at, ?1)" +
			" WHERE event_id = ?2"
		args = []any{mod, id}
	}
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("sqlfixture: backdate %s: %d rows", id, n)
	}
	return nil
}

// Crash abandons every open claim as a relay's death does. On PostgreSQL
// it terminates every other connection to the fixture's database, which
// ends their transactions and row locks, and empties the pool of the
// fixture's own idle connections (killed too). On SQLite, whose claims are
// leases, there is nothing to kill: it ends every lease now, as their
// expiry ClaimLease later would.
func (f *DB) Crash(ctx context.Context) error {
	if f.Dialect.ClaimMode() != dialect.ClaimRowLocks {
		if _, err := f.DB.ExecContext(ctx, "UPDATE "+f.Dialect.Quote(f.Table)+" SET claimed_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 second') WHERE claimed_until IS NOT NULL"); err != nil {
			return fmt.Errorf("sqlfixture: end the claims' leases: %w", err)
		}
		return nil
	}
	conn, err := f.DB.Conn(ctx)
	if err != nil {
		return err
	}
	if f.Dialect == dialect.MySQL {
		err = killMySQL(ctx, conn)
	} else {
		var rows *sql.Rows
		rows, err = conn.QueryContext(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
		if err == nil {
			err = rows.Close()
		}
	}
	conn.Close()
	if err != nil {
		return fmt.Errorf("sqlfixture: terminate connections: %w", err)
	}
	f.DB.SetMaxIdleConns(0)
	f.DB.SetMaxIdleConns(MaxOpenConns)
	return nil
}

// StoreFixture returns the suite's fixture of store, a store on f.DB and
// f.Table (with ClaimLease f.ClaimLease if it leases rows).
func (f *DB) StoreFixture(store core.Store) *outboxtest.StoreFixture {
	return &outboxtest.StoreFixture{
		Store:             store,
		Enqueue:           f.Enqueue,
		EnqueueThenCommit: f.EnqueueThenCommit,
		Get:               f.Get,
		Backdate:          f.Backdate,
		RetryDead:         f.RetryDead,
		Crash:             f.Crash,
		ClaimLease:        f.ClaimLease,
	}
}

// killMySQL kills every other session on conn's database.
func killMySQL(ctx context.Context, conn *sql.Conn) error {
	rows, err := conn.QueryContext(ctx, "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()")
	if err != nil {
		return err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		ids = append(ids, id)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	for _, id := range ids {
		// A session that ended meanwhile is no error.
		if _, err := conn.ExecContext(ctx, "KILL "+strconv.FormatInt(id, 10)); err != nil && !strings.Contains(err.Error(), "Unknown thread") {
			return err
		}
	}
	return nil
}

// CreateMySQLDatabase creates an empty database on the MySQL or MariaDB
// server of adminURL (mysql://user:password@host:port/), drops it when the
// test ends, and returns its DSN in the form of
// github.com/go-sql-driver/mysql.
func CreateMySQLDatabase(t testing.TB, adminURL string) string {
	t.Helper()
	cfg, err := mysqldsn.Config(adminURL)
	if err != nil {
		t.Fatalf("sqlfixture: %v", err)
	}
	name := "t_" + randomID()
	admin := cfg.Clone()
	admin.DBName = ""
	db, err := sql.Open("mysql", admin.FormatDSN())
	if err != nil {
		t.Fatalf("sqlfixture: open admin connection: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		db.Close()
		t.Fatalf("sqlfixture: create database %s on %s: %v", name, redact(adminURL), err)
	}
	t.Cleanup(func() {
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Logf("sqlfixture: drop database %s: %v", name, err)
		}
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// CreatePostgresDatabase returns the DSN of an empty database on the server
// of adminDSN for the test. When the test ends the database is emptied and
// renamed, and the next test of the process that asks for one gets it (or
// it is dropped, with its connections, a few seconds later): see reuse.go
// and dropper for why.
func CreatePostgresDatabase(t testing.TB, adminDSN string) string {
	t.Helper()
	return dropperFor(adminDSN).create(t)
}

func randomID() string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		panic(errors.Join(errors.New("crypto/rand"), err))
	}
	return hex.EncodeToString(b)
}

// redact hides the password of a URL DSN.
func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(a DSN that does not parse)"
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}
