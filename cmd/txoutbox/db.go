package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	_ "modernc.org/sqlite"             // the pure-Go "sqlite" database/sql driver

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/mysqldsn"
)

// database is an open database and its dialect.
type database struct {
	db      *sql.DB
	dialect dialect.Dialect
	// redacted is the DSN without its password, for logs.
	redacted string
}

// openDatabase opens and pings the database of dsn:
//
//	postgres://user:pass@host:5432/db?sslmode=disable   (also postgresql://)
//	host=db user=app password=... dbname=app            (PostgreSQL key/value)
//	mysql://user:pass@host:3306/db                      (MySQL, MariaDB; also mariadb://)
//	user:pass@tcp(host:3306)/db                         (go-sql-driver/mysql's own form)
//	sqlite:path/to/file.db  sqlite:///abs/path.db  file:path.db
func openDatabase(ctx context.Context, dsn string) (*database, error) {
	driver, source, d, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open(driver, source)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", redact(dsn), err)
	}
	poolSizes(db, d)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connect to %s: %w", redact(dsn), err)
	}
	return &database{db: db, dialect: d, redacted: redact(dsn)}, nil
}

func (d *database) Close() error { return d.db.Close() }

// maxConns bounds the CLI's pool: the relay's workers, the ordered
// leaser, the monitor, cleanup and archive use a handful at once.
const maxConns = 16

// poolSizes keeps as many connections idle as may be open: database/sql
// keeps two idle by default, so a third concurrent user opened (and on its
// return closed) a server connection every time, a process fork per
// transaction on PostgreSQL. Idle connections close after five minutes.
func poolSizes(db *sql.DB, d dialect.Dialect) {
	if d.MaxConcurrency() == 1 {
		// One writer: a second connection would only wait for the lock.
		db.SetMaxOpenConns(1)
		return
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
}

// openDatabaseLazily opens the database of dsn without connecting: the
// relay waits for it (see awaitDependency).
func openDatabaseLazily(dsn string) (*database, error) {
	driver, source, d, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open(driver, source)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", redact(dsn), err)
	}
	poolSizes(db, d)
	return &database{db: db, dialect: d, redacted: redact(dsn)}, nil
}

// openOutbox opens the database of --dsn and the Outbox of --table on it.
func (a *app) openOutbox(ctx context.Context) (*database, *sqlxoutbox.Outbox, error) {
	return a.openOutboxWith(ctx, sqlxoutbox.Options{})
}

// openOutboxWith is openOutbox with further Outbox options; the dialect,
// table and logger come from the flags.
func (a *app) openOutboxWith(ctx context.Context, opts sqlxoutbox.Options) (*database, *sqlxoutbox.Outbox, error) {
	dsn, err := a.requireDSN()
	if err != nil {
		return nil, nil, err
	}
	db, err := openDatabase(ctx, dsn)
	if err != nil {
		return nil, nil, err
	}
	opts.Dialect, opts.Table, opts.Logger = db.dialect, a.table, a.log
	ob, err := sqlxoutbox.NewDB(db.db, opts)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	// A missing table says so at once, rather than as every query's error.
	if err := ob.Ping(ctx); err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, ob, nil
}

func parseDSN(dsn string) (driver, source string, d dialect.Dialect, err error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return "pgx", dsn, dialect.Postgres, nil
	case mysqldsn.IsURL(dsn), mysqldsn.IsDriverDSN(dsn):
		cfg, err := mysqldsn.Config(dsn)
		if err != nil {
			// The driver's message does not quote the DSN.
			return "", "", d, usagef("MySQL DSN %s: %v", redact(dsn), err)
		}
		// The CLI owns its connections: interpolating the arguments saves
		// the prepare round trip the driver makes for every statement
		// otherwise. Safe with any character set the driver supports.
		if !strings.Contains(dsn, "interpolateParams") {
			cfg.InterpolateParams = true
		}
		return "mysql", cfg.FormatDSN(), dialect.MySQL, nil
	case strings.HasPrefix(dsn, "sqlite:"), strings.HasPrefix(dsn, "file:"):
		path := strings.TrimPrefix(strings.TrimPrefix(dsn, "sqlite:"), "//")
		if strings.HasPrefix(dsn, "file:") {
			path = dsn
		}
		if path == "" {
			return "", "", d, usagef("sqlite DSN %q has no path", dsn)
		}
		// The relay and producers write concurrently: wait for the lock
		// instead of failing with SQLITE_BUSY, and let readers run beside
		// the writer.
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		return "sqlite", path + sep + "_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate", dialect.SQLite, nil
	}
	if !strings.Contains(dsn, "://") && strings.Contains(dsn, "=") {
		// PostgreSQL's key/value form, which pgx reads.
		return "pgx", dsn, dialect.Postgres, nil
	}
	return "", "", d, usagef("unsupported DSN %q: want postgres://..., host=... (PostgreSQL key/value), mysql://... or sqlite:PATH", redact(dsn))
}
