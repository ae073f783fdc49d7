package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/fixtures"
	"github.com/txoutbox/txoutbox/internal/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// sqliteDSN is a file database (":memory:" is one database per connection)
// with the settings a concurrent consumer needs: WAL so that readers do not
// block the writer, and a busy_timeout so that writers wait for each other.
func sqliteDSN(t testing.TB, busy bool) string {
	dsn := "file:" + filepath.Join(t.TempDir(), "inbox.db") + "?_pragma=journal_mode(WAL)"
	if busy {
		dsn += "&_pragma=busy_timeout(10000)"
	}
	return dsn
}

func openSQLite(t testing.TB, busy bool) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", sqliteDSN(t, busy))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// backend is one database under test, opened fresh per subtest.
type backend struct {
	name    string
	dialect string
	open    func(t testing.TB) *sql.DB
}

var backends = []backend{
	{"Postgres", "postgres", func(t testing.TB) *sql.DB { return testenv.OpenPostgres(t) }},
	{"SQLite", "sqlite", func(t testing.TB) *sql.DB { return openSQLite(t, true) }},
	// No busy_timeout in the DSN: the inbox's own retry has to absorb
	// SQLITE_BUSY for concurrent duplicates.
	{"SQLiteNoBusyTimeout", "sqlite", func(t testing.TB) *sql.DB { return openSQLite(t, false) }},
}

func (b backend) rebind(q string) string {
	if b.dialect == "postgres" {
		return sqlx.Rebind(sqlx.DOLLAR, q)
	}
	return q
}

func (b backend) timeArg(t time.Time) any {
	if b.dialect == "sqlite" {
		return t.UTC().Format("2006-01-02T15:04:05.000Z")
	}
	return t
}

// newSQLFixture makes an inbox on a fresh database. With useSqlx the inbox
// runs on a *sqlx.DB and the handler writes through Txx; otherwise on a
// *sql.DB through Tx.
func (b backend) newSQLFixture(t *testing.T, useSqlx bool) (*outboxtest.InboxFixture, *inbox.SQL, *sql.DB) {
	t.Helper()
	db := b.open(t)
	ctx := t.Context()
	var handle inbox.DB = db
	if useSqlx {
		handle = sqlx.NewDb(db, b.dialect)
	}
	opts := inbox.SQLOptions{}
	if b.name == "SQLiteNoBusyTimeout" {
		// Under -race on a loaded machine, 80 deliveries polling for one
		// lock take tens of seconds; the default 30s is for production.
		opts.BusyTimeout = 3 * time.Minute
	}
	ib, err := inbox.NewSQL(handle, opts)
	if err != nil {
		t.Fatal(err)
	}
	if ib.Dialect().Name() != b.dialect {
		t.Fatalf("detected dialect %q, want %q", ib.Dialect(), b.dialect)
	}
	migrate(t, db, ib.Dialect())
	if _, err := db.ExecContext(ctx, fixtures.EffectsDDL); err != nil {
		t.Fatal(err)
	}
	insert := b.rebind(`INSERT INTO effects (key) VALUES (?)`)
	f := &outboxtest.InboxFixture{
		Inbox: ib,
		Effect: func(ctx context.Context, key string) error {
			if useSqlx {
				tx := inbox.Txx(ctx)
				if tx == nil {
					return errors.New("no *sqlx.Tx in the handler's context")
				}
				_, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO effects (key) VALUES (?)`), key)
				return err
			}
			tx := inbox.Tx(ctx)
			if tx == nil {
				return errors.New("no *sql.Tx in the handler's context")
			}
			_, err := tx.ExecContext(ctx, insert, key)
			return err
		},
		Effects:   func(ctx context.Context) (map[string]int, error) { return fixtures.CountEffects(ctx, db) },
		Processed: ib.Processed,
		Cleaner:   ib,
		Backdate: func(ctx context.Context, consumer, eventID string, age time.Duration) error {
			_, err := db.ExecContext(ctx, b.rebind(`UPDATE processed_events SET processed_at = ? WHERE consumer = ? AND event_id = ?`),
				b.timeArg(time.Now().Add(-age)), consumer, eventID)
			return err
		},
	}
	return f, ib, db
}

// migrate creates the inbox table with the shared migrations, as a
// consumer-only service would.
func migrate(t testing.TB, db *sql.DB, d dialect.Dialect) {
	t.Helper()
	opts := dialect.MigrateOptions{SkipOutbox: true, Logger: slog.New(slog.DiscardHandler)}
	if err := dialect.Migrate(t.Context(), db, d, opts); err != nil {
		t.Fatalf("migrate: %v", err)
	}
}

func TestConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.RunInbox(t, func(t *testing.T) *outboxtest.InboxFixture {
				f, _, _ := b.newSQLFixture(t, false)
				return f
			})
		})
		t.Run(b.name+"Sqlx", func(t *testing.T) {
			t.Parallel()
			outboxtest.RunInbox(t, func(t *testing.T) *outboxtest.InboxFixture {
				f, _, _ := b.newSQLFixture(t, true)
				return f
			})
		})
	}
}
