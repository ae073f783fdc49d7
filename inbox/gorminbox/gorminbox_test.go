package gorminbox_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	_ "modernc.org/sqlite" // the pure-Go "sqlite" driver, under GORM's dialector

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox/gorminbox"
	"github.com/txoutbox/txoutbox/internal/testkit/gormfixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

func openGorm(t *testing.T, name string) (*gorm.DB, *sql.DB, dialect.Dialect) {
	t.Helper()
	var (
		sqlDB *sql.DB
		dl    gorm.Dialector
		d     dialect.Dialect
	)
	switch name {
	case "postgres":
		sqlDB = testenv.OpenPostgres(t)
		dl, d = postgres.New(postgres.Config{Conn: sqlDB}), dialect.Postgres
	case "mariadb":
		sqlDB = testenv.OpenMySQL(t, "parseTime=true")
		dl, d = mysql.New(mysql.Config{Conn: sqlDB}), dialect.MySQL
	case "sqlite":
		var err error
		dsn := "file:" + filepath.Join(t.TempDir(), "inbox.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)"
		sqlDB, err = sql.Open("sqlite", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sqlDB.Close() })
		dl, d = sqlite.New(sqlite.Config{DriverName: "sqlite", Conn: sqlDB}), dialect.SQLite
	}
	db, err := gorm.Open(dl, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := dialect.Migrate(t.Context(), sqlDB, d, dialect.MigrateOptions{SkipOutbox: true, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(`CREATE TABLE effects (effect_key VARCHAR(255) NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	return db, sqlDB, d
}

func newFixture(t *testing.T, name string) *outboxtest.InboxFixture {
	db, _, d := openGorm(t, name)
	return gormfixtures.Inbox(t, db, d)
}

func TestConformance(t *testing.T) {
	for _, name := range []string{"postgres", "sqlite", "mariadb"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			outboxtest.RunInbox(t, func(t *testing.T) *outboxtest.InboxFixture { return newFixture(t, name) })
		})
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := gorminbox.New(nil, gorminbox.Options{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("New(nil) = %v, want ErrInvalidOptions", err)
	}
	db, _, _ := openGorm(t, "sqlite")
	if _, err := gorminbox.New(db, gorminbox.Options{Table: `x"; DROP TABLE y`}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("New(bad table) = %v, want ErrInvalidOptions", err)
	}
}

func TestTxOutsideHandlerIsNil(t *testing.T) {
	if tx := gorminbox.Tx(context.Background()); tx != nil {
		t.Fatalf("Tx outside a handler = %v, want nil", tx)
	}
	db, _, _ := openGorm(t, "sqlite")
	ctx := gorminbox.ContextWithTx(t.Context(), db)
	if gorminbox.Tx(ctx) == nil {
		t.Fatal("Tx after ContextWithTx = nil")
	}
}
