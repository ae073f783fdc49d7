package gormoutbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// pgSchema describes a table from PostgreSQL's catalog: every column with
// its type, nullability and default, and every index definition.
func pgSchema(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	var out []string
	rows, err := db.Query(`SELECT column_name, data_type, is_nullable, coalesce(column_default, ''), ordinal_position
		FROM information_schema.columns WHERE table_schema = 'public' AND table_name = $1 ORDER BY column_name`, table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name, typ, null, def string
		var pos int
		if err := rows.Scan(&name, &typ, &null, &def, &pos); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("column %s #%d %s null=%s default=%s", name, pos, typ, null, def))
	}
	rows.Close()
	rows, err = db.Query(`SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = $1`, table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var def string
		if err := rows.Scan(&def); err != nil {
			t.Fatal(err)
		}
		// The primary key's index is named by whoever created it.
		if strings.Contains(def, "_pkey ON") {
			def = "primary key: " + def[strings.Index(def, " USING "):]
		}
		out = append(out, "index "+def)
	}
	rows.Close()
	slices.Sort(out)
	return out
}

func TestAutoMigrateMatchesSQLMigrationOnPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	viaSQL := testenv.OpenPostgres(t)
	if err := dialect.Migrate(ctx, viaSQL, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: discardLogger()}); err != nil {
		t.Fatal(err)
	}
	viaGORM := testenv.OpenPostgres(t)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: viaGORM}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.AutoMigrate(&gormoutbox.OutboxEvent{}); err != nil {
		t.Fatal(err)
	}
	want, got := pgSchema(t, viaSQL, dialect.DefaultTable), pgSchema(t, viaGORM, dialect.DefaultTable)
	t.Logf("schema of the SQL migration:\n  %s", strings.Join(want, "\n  "))
	if len(want) < 14 {
		t.Fatalf("catalog read too little: %v", want)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("AutoMigrate schema differs from the SQL migration:\n got:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	// Either may follow the other: the SQL migration on the AutoMigrated
	// table, and AutoMigrate again, change nothing.
	if err := dialect.Migrate(ctx, viaGORM, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: discardLogger()}); err != nil {
		t.Fatal(err)
	}
	if err := gormoutbox.AutoMigrate(db, gormoutbox.MigrateOptions{}); err != nil {
		t.Fatal(err)
	}
	if again := pgSchema(t, viaGORM, dialect.DefaultTable); strings.Join(again, "\n") != strings.Join(want, "\n") {
		t.Fatalf("schema changed by a second migration:\n%s", strings.Join(again, "\n"))
	}
	// The AutoMigrated table works with the Plugin and reads back through
	// the model.
	if err := db.Use(gormoutbox.Plugin{}); err != nil {
		t.Fatal(err)
	}
	ev := core.Event{EventType: "x.made", AggregateType: "x", AggregateID: "1", Payload: []byte(`{"a":1}`), Headers: map[string]string{"h": "v"}}
	if err := db.Transaction(func(tx *gorm.DB) error { return gormoutbox.Enqueue(tx, ev) }); err != nil {
		t.Fatal(err)
	}
	var row gormoutbox.OutboxEvent
	if err := db.First(&row).Error; err != nil {
		t.Fatal(err)
	}
	got1, err := row.Event()
	if err != nil {
		t.Fatal(err)
	}
	if got1.EventType != "x.made" || got1.Headers["h"] != "v" || got1.Seq == 0 || time.Since(got1.CreatedAt) > time.Minute || got1.PublishedAt != nil {
		t.Fatalf("read back %+v", got1)
	}
}

func TestAutoMigrateSQLiteAndCustomTable(t *testing.T) {
	t.Parallel()
	sqlDB := openSQLite(t, filepath.Join(t.TempDir(), "m.db"))
	db, err := gorm.Open(sqlite.New(sqlite.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"", "other_outbox"} {
		if err := gormoutbox.AutoMigrate(db, gormoutbox.MigrateOptions{Table: table, Logger: discardLogger()}); err != nil {
			t.Fatal(err)
		}
	}
	var indexes []string
	if err := db.Raw("SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE '%claim' ORDER BY name").Scan(&indexes).Error; err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(indexes) != "[other_outbox_claim outbox_events_claim]" {
		t.Fatalf("claim indexes %v", indexes)
	}
	if err := gormoutbox.AutoMigrate(db, gormoutbox.MigrateOptions{Table: "bad name"}); err == nil {
		t.Fatal("AutoMigrate accepted an invalid table name")
	}
}

// mysqlSchema describes the tables of the database behind db from
// information_schema: every column with its type, nullability and default,
// and every index with its columns in order.
func mysqlSchema(t *testing.T, db *sql.DB) []string {
	t.Helper()
	var out []string
	rows, err := db.Query(`SELECT table_name, column_name, column_type, is_nullable, COALESCE(column_default, ''), collation_name IS NULL
		FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name <> 'orders' ORDER BY table_name, ordinal_position`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var table, name, typ, null, def string
		var noCollation bool
		if err := rows.Scan(&table, &name, &typ, &null, &def, &noCollation); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s.%s %s null=%s default=%s", table, name, typ, null, def))
	}
	rows.Close()
	rows, err = db.Query(`SELECT table_name, index_name, GROUP_CONCAT(column_name ORDER BY seq_in_index), MIN(non_unique)
		FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name <> 'orders'
		GROUP BY table_name, index_name ORDER BY table_name, index_name`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var table, name, cols string
		var nonUnique int
		if err := rows.Scan(&table, &name, &cols, &nonUnique); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s index %s (%s) unique=%v", table, name, cols, nonUnique == 0))
	}
	rows.Close()
	return out
}

// On MySQL and MariaDB, AutoMigrate creates exactly the schema of the SQL
// migrations (it runs them: the GORM model's PostgreSQL types and partial
// indexes have no MySQL form), next to the application's own AutoMigrate,
// and again without change.
func TestAutoMigrateMatchesSQLMigrationOnMySQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	viaSQL := testenv.OpenMySQL(t)
	if err := dialect.Migrate(ctx, viaSQL, dialect.MySQL, dialect.MigrateOptions{Logger: discardLogger()}); err != nil {
		t.Fatal(err)
	}
	viaGORM := testenv.OpenMySQL(t, "parseTime=true")
	db, err := gorm.Open(mysql.New(mysql.Config{Conn: viaGORM}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.AutoMigrate(&order{}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := gormoutbox.AutoMigrate(db, gormoutbox.MigrateOptions{Inbox: true, Logger: discardLogger()}); err != nil {
			t.Fatal(err)
		}
	}
	want, got := mysqlSchema(t, viaSQL), mysqlSchema(t, viaGORM)
	if len(want) < 20 {
		t.Fatalf("the SQL migration's schema has %d entries: %v", len(want), want)
	}
	if !slices.Equal(want, got) {
		t.Fatalf("AutoMigrate's schema differs from the SQL migration's:\n--- SQL\n  %s\n--- AutoMigrate\n  %s",
			strings.Join(want, "\n  "), strings.Join(got, "\n  "))
	}
	t.Logf("schema:\n  %s", strings.Join(want, "\n  "))
	// The rows GORM writes read back through the model.
	if err := db.Use(gormoutbox.Plugin{}); err != nil {
		t.Fatal(err)
	}
	if err := db.Create(&order{BuyerID: "b", Total: 7}).Error; err != nil {
		t.Fatal(err)
	}
	var rows []gormoutbox.OutboxEvent
	if err := db.Order("id").Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].EventType != "order.create" || rows[0].CreatedAt.IsZero() || rows[0].CreatedAt.Location() != time.UTC {
		t.Fatalf("rows read through the model: %+v", rows)
	}
}
