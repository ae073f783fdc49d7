package pgbouncertest_test

import (
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	pgxoutbox "github.com/txoutbox/txoutbox/adapters/pgx"
	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/console"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/gormfixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

var quiet = slog.New(slog.DiscardHandler)

// bouncer is a fresh database's DSN through PgBouncer.
func bouncer(t testing.TB) string {
	dsn, _ := testenv.PgBouncerDSN(t, "default_query_exec_mode", "exec")
	return dsn
}

func sqlxStore(t *testing.T) *outboxtest.StoreFixture {
	return fixtures.SQLXPostgres(t, fixtures.Options{Logger: quiet, SkipInbox: true, PgBouncer: true})
}

func pgxStore(t *testing.T) *outboxtest.StoreFixture {
	return fixtures.PGXPostgres(t, fixtures.Options{Logger: quiet, SkipInbox: true, PgBouncer: true})
}

// gormDB opens GORM (its postgres driver, on pgx's database/sql driver)
// through PgBouncer.
func gormDB(t *testing.T) *gorm.DB {
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: testenv.OpenPostgresDSN(t, bouncer(t))}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func gormStore(t *testing.T) *outboxtest.StoreFixture {
	db := gormDB(t)
	if err := gormoutbox.AutoMigrate(db, gormoutbox.MigrateOptions{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if err := db.Use(gormoutbox.Plugin{}); err != nil {
		t.Fatal(err)
	}
	return gormfixtures.Store(t, db, dialect.Postgres)
}

// Producers (Enqueue, ExecWithEvents, the GORM plugin) and the relay's
// claims and marks, unordered and ordered (partition leases and
// transaction-level advisory locks), through PgBouncer.
func TestStores(t *testing.T) {
	t.Parallel()
	for name, s := range map[string]outboxtest.NewStoreFunc{"SQLX": sqlxStore, "PGX": pgxStore, "GORM": gormStore} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			t.Run("Store", func(t *testing.T) { t.Parallel(); outboxtest.RunStore(t, s) })
			if name == "SQLX" {
				// The pgx and GORM stores claim with the same SQL.
				t.Run("OrderedStore", func(t *testing.T) { t.Parallel(); outboxtest.RunOrderedStore(t, s) })
			}
		})
	}
}

func sqlInbox(t *testing.T) *outboxtest.InboxFixture {
	be := fixtures.InboxBackend{Name: "PgBouncer", Dialect: "postgres", Open: func(t testing.TB) *sql.DB { return testenv.OpenPostgresDSN(t, bouncer(t)) }}
	f, _, _ := be.NewSQLInbox(t, true)
	return f
}

func gormInbox(t *testing.T) *outboxtest.InboxFixture {
	db := gormDB(t)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	if err := dialect.Migrate(t.Context(), sqlDB, dialect.Postgres, dialect.MigrateOptions{SkipOutbox: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(fixtures.EffectsDDL).Error; err != nil {
		t.Fatal(err)
	}
	return gormfixtures.Inbox(t, db, dialect.Postgres)
}

// The inboxes through PgBouncer: exactly once under concurrent duplicates.
func TestInboxes(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]outboxtest.NewInboxFunc{
		"SQL":  sqlInbox,
		"PGX":  func(t *testing.T) *outboxtest.InboxFixture { return fixtures.PGXInboxOn(t, bouncer(t)) },
		"GORM": gormInbox,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			outboxtest.RunInbox(t, in)
		})
	}
}

// A service whose producers, relay and consumers all reach PostgreSQL
// through PgBouncer, with RabbitMQ between them: every committed event
// takes effect once.
func TestExactlyOnce(t *testing.T) {
	t.Parallel()
	outboxtest.RunExactlyOnce(t, sqlxStore, func(t *testing.T) *outboxtest.BrokerFixture { return fixtures.RabbitMQ(t) }, sqlInbox)
}

// ExecWithEvents (the business statement and the events in one statement)
// on database/sql and on pgxpool, and the console's pages, through
// PgBouncer.
func TestExecWithEventsAndConsole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := bouncer(t)
	db := testenv.OpenPostgresDSN(t, dsn)
	if err := dialect.Migrate(ctx, db, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE orders (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	sqlBox, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	pool := testenv.OpenPgxPool(t, dsn)
	pgxBox, err := pgxoutbox.New(pool, pgxoutbox.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	newEvent := func(id string) core.Event {
		ev, err := core.NewEvent("order", id, "order.created", map[string]string{"id": id})
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	for i := range 20 {
		id := fmt.Sprint("s-", i)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sqlBox.ExecWithEvents(ctx, tx, "INSERT INTO orders (id) VALUES ($1)", []any{id}, newEvent(id)); err != nil {
			t.Fatalf("database/sql ExecWithEvents through PgBouncer: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		id = fmt.Sprint("p-", i)
		ptx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pgxBox.ExecWithEvents(ctx, ptx, "INSERT INTO orders (id) VALUES ($1)", []any{id}, newEvent(id)); err != nil {
			t.Fatalf("pgx ExecWithEvents through PgBouncer: %v", err)
		}
		if err := ptx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var orders, events int
	if err := db.QueryRowContext(ctx, "SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM outbox_events)").Scan(&orders, &events); err != nil || orders != 40 || events != 40 {
		t.Fatalf("%d orders and %d events (%v), want 40 of each", orders, events, err)
	}
	c, err := console.New(sqlBox, console.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/", "/events", "/dead"} {
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK {
			t.Errorf("console %s through PgBouncer: %d\n%s", path, rec.Code, rec.Body.String())
		}
	}
}
