package gormoutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	_ "modernc.org/sqlite" // the pure-Go "sqlite" database/sql driver

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// order is the test model. Its events carry the generated ID and
// created_at, so that tests see the statement ran before OutboxEvents.
type order struct {
	ID        int64 `gorm:"primaryKey"`
	BuyerID   string
	Total     int64
	Status    string
	CreatedAt time.Time
	UpdatedAt time.Time

	// failEvents makes OutboxEvents fail.
	failEvents bool `gorm:"-"`
}

// orderPayload is what the events of an order carry.
type orderPayload struct {
	OrderID   int64     `json:"order_id"`
	BuyerID   string    `json:"buyer_id"`
	Total     int64     `json:"total"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
}

var errModelEvents = errors.New("order refuses to give events")

func (o *order) OutboxEvents(op gormoutbox.Op) ([]core.Event, error) {
	if o.failEvents {
		return nil, errModelEvents
	}
	ev, err := core.NewEvent("order", strconv.FormatInt(o.ID, 10), "order."+op.String(),
		orderPayload{OrderID: o.ID, BuyerID: o.BuyerID, Total: o.Total, Status: o.Status, CreatedAt: o.CreatedAt})
	if err != nil {
		return nil, err
	}
	ev.Headers = map[string]string{"op": op.String()}
	return []core.Event{ev}, nil
}

// plainOrder is the same table without events, for baselines.
type plainOrder struct {
	ID        int64 `gorm:"primaryKey"`
	BuyerID   string
	Total     int64
	Status    string
	CreatedAt time.Time
	UpdatedAt time.Time
}

func (plainOrder) TableName() string { return "orders" }

// backend opens a fresh database of one kind.
type backend struct {
	name string
	// open returns a new *sql.DB on a fresh database, and the GORM
	// dialector for a connection pool on it.
	open func(t testing.TB) (*sql.DB, func(gorm.ConnPool) gorm.Dialector)
}

var backends = []backend{
	{name: "postgres", open: func(t testing.TB) (*sql.DB, func(gorm.ConnPool) gorm.Dialector) {
		sqlDB := testenv.OpenPostgres(t)
		return sqlDB, func(cp gorm.ConnPool) gorm.Dialector { return postgres.New(postgres.Config{Conn: cp}) }
	}},
	{name: "sqlite", open: func(t testing.TB) (*sql.DB, func(gorm.ConnPool) gorm.Dialector) {
		return openSQLite(t, filepath.Join(t.TempDir(), "test.db")), func(cp gorm.ConnPool) gorm.Dialector {
			return sqlite.New(sqlite.Config{Conn: cp})
		}
	}},
	{name: "mariadb", open: func(t testing.TB) (*sql.DB, func(gorm.ConnPool) gorm.Dialector) {
		// GORM scans DATETIME into time.Time only with parseTime.
		sqlDB := testenv.OpenMySQL(t, "parseTime=true")
		return sqlDB, func(cp gorm.ConnPool) gorm.Dialector {
			return mysql.New(mysql.Config{Conn: cp, SkipInitializeWithVersion: false})
		}
	}},
}

// openSQLite opens path with modernc's driver: WAL, a busy timeout, and
// BEGIN IMMEDIATE, so that concurrent writers queue instead of failing on
// a lock upgrade.
func openSQLite(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// env is one test's database: GORM with the Plugin on it, and the raw pool.
type env struct {
	name  string
	sqlDB *sql.DB
	db    *gorm.DB
	// stmts counts the statements sent to the database (BEGIN, COMMIT
	// and ROLLBACK excluded).
	stmts *atomic.Int64
}

// newEnv migrates a fresh database and opens GORM on it with plugin (nil:
// no plugin).
func newEnv(t testing.TB, b backend, plugin *gormoutbox.Plugin, cfg *gorm.Config) *env {
	t.Helper()
	sqlDB, dialector := b.open(t)
	d, err := dialect.ByName(b.name)
	if err != nil {
		t.Fatal(err)
	}
	if err := dialect.Migrate(context.Background(), sqlDB, d, dialect.MigrateOptions{SkipInbox: true, Logger: discardLogger()}); err != nil {
		t.Fatal(err)
	}
	e := &env{name: b.name, sqlDB: sqlDB, stmts: new(atomic.Int64)}
	if cfg == nil {
		cfg = &gorm.Config{}
	}
	cfg.Logger = logger.Discard
	db, err := gorm.Open(dialector(countingPool{DB: sqlDB, n: e.stmts}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.AutoMigrate(&order{}); err != nil {
		t.Fatal(err)
	}
	if plugin != nil {
		if err := db.Use(*plugin); err != nil {
			t.Fatal(err)
		}
	}
	e.db = db
	return e
}

// forEach runs f as a subtest on each backend.
func forEach(t *testing.T, plugin *gormoutbox.Plugin, f func(t *testing.T, e *env)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			p := plugin
			if p == nil {
				p = &gormoutbox.Plugin{}
			}
			f(t, newEnv(t, b, p, nil))
		})
	}
}

// storedEvent is an outbox row as the tests read it back.
type storedEvent struct {
	AggregateID string
	EventType   string
	Payload     string
	Headers     string
}

// outboxRows returns the outbox, oldest first, read with raw SQL so that
// nothing of the adapter is trusted.
func (e *env) outboxRows(t testing.TB) []storedEvent {
	t.Helper()
	rows, err := e.sqlDB.Query("SELECT aggregate_id, event_type, payload, headers FROM outbox_events ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []storedEvent
	for rows.Next() {
		var s storedEvent
		if err := rows.Scan(&s.AggregateID, &s.EventType, &s.Payload, &s.Headers); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func (e *env) countOrders(t testing.TB) int {
	t.Helper()
	var n int
	if err := e.sqlDB.QueryRow("SELECT count(*) FROM orders").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// countingPool is the connection pool GORM runs on in the tests: the
// *sql.DB, counting every statement, the Plugin's included.
type countingPool struct {
	*sql.DB
	n *atomic.Int64
}

func (c countingPool) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	c.n.Add(1)
	return c.DB.ExecContext(ctx, q, args...)
}

func (c countingPool) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	c.n.Add(1)
	return c.DB.QueryContext(ctx, q, args...)
}

func (c countingPool) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	c.n.Add(1)
	return c.DB.QueryRowContext(ctx, q, args...)
}

func (c countingPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	tx, err := c.DB.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &countingTx{Tx: tx, n: c.n}, nil
}

func (c countingPool) GetDBConn() (*sql.DB, error) { return c.DB, nil }

type countingTx struct {
	*sql.Tx
	n *atomic.Int64
}

func (c *countingTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	c.n.Add(1)
	return c.Tx.ExecContext(ctx, q, args...)
}

func (c *countingTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	c.n.Add(1)
	return c.Tx.QueryContext(ctx, q, args...)
}

func (c *countingTx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	c.n.Add(1)
	return c.Tx.QueryRowContext(ctx, q, args...)
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
