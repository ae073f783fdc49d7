package pgbouncertest_test

import (
	"database/sql"
	"log/slog"
	"testing"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/fixtures"
	"github.com/txoutbox/txoutbox/internal/gormfixtures"
	"github.com/txoutbox/txoutbox/internal/testenv"
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
