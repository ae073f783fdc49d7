package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"runtime"
	"slices"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/jmoiron/sqlx"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/dialect"
)

// bench is one run: a fresh database and what the scenarios share.
type bench struct {
	c       config
	log     *slog.Logger
	quiet   *slog.Logger // for the components under test: their logs are not the benchmark's
	admin   string
	name    string
	dsn     string
	db      *sql.DB
	server  string
	machine string
	// mysqlServer is the MySQL server's version, once scenario m ran.
	mysqlServer string
	// watermillBacklogRate is scenario b's median rate of Watermill's
	// forwarder on the full backlog, for scenario l to compare with.
	watermillBacklogRate float64
	// teardown runs before the database is dropped (log mode's slots).
	teardown []func() error
}

func newBench(ctx context.Context, c config, log *slog.Logger) (*bench, error) {
	b := &bench{c: c, log: log, admin: c.DSN, quiet: slog.New(slog.NewTextHandler(io.Discard, nil))}
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return nil, err
	}
	b.name = "txoutbox_bench_" + hex.EncodeToString(suffix)
	adm, err := sql.Open("pgx", c.DSN)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", redact(c.DSN), err)
	}
	defer adm.Close()
	if _, err := adm.ExecContext(ctx, "CREATE DATABASE "+b.name); err != nil {
		return nil, fmt.Errorf("create database (the DSN must be allowed to): %w", err)
	}
	u, err := url.Parse(c.DSN)
	if err != nil || u.Scheme == "" {
		return nil, fmt.Errorf("the DSN must be a postgres:// URL: %v", err)
	}
	u.Path = "/" + b.name
	b.dsn = u.String()
	if b.db, err = b.open(""); err != nil {
		return nil, err
	}
	var version, fsync, syncCommit string
	if err := b.db.QueryRowContext(ctx, "SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit')").Scan(&version, &fsync, &syncCommit); err != nil {
		return nil, err
	}
	// The producers' figures (d) depend on whether a commit waits for a
	// disk flush, so the table says which server it was.
	b.server = fmt.Sprintf("%s, fsync %s, synchronous_commit %s", version, fsync, syncCommit)
	if fsync != "on" {
		log.Warn("the server runs with fsync off: commits cost no flush, and scenario d measures a server no one runs in production")
	}
	b.machine = fmt.Sprintf("%d CPUs, %s/%s, %s", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	log.Info("bench database", "name", b.name)
	return b, nil
}

// open returns a pool on the bench database; params are extra URL query
// parameters, which pgx sends as run-time parameters (synchronous_commit=off).
func (b *bench) open(params string) (*sql.DB, error) {
	dsn := b.dsn
	if params != "" {
		dsn = withParams(dsn, params)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	return db, nil
}

func withParams(dsn, params string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	q := u.Query()
	extra, _ := url.ParseQuery(params)
	for k, v := range extra {
		q[k] = v
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func (b *bench) close() error {
	var errs []error
	for _, f := range b.teardown {
		errs = append(errs, f())
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if b.db != nil {
		b.db.Close()
	}
	if b.c.Keep {
		b.log.Warn("kept the bench database", "name", b.name)
		return nil
	}
	adm, err := sql.Open("pgx", b.admin)
	if err != nil {
		return err
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := adm.ExecContext(ctx, "DROP DATABASE IF EXISTS "+b.name+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop bench database %s: %w", b.name, err)
	}
	return nil
}

func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(unparsable DSN)"
	}
	return u.Redacted()
}

// outbox creates the outbox table named table with txoutbox's own migration
// and returns an Outbox on db for it.
func (b *bench) outbox(ctx context.Context, db *sql.DB, table string, opts sqlxoutbox.Options) (*sqlxoutbox.Outbox, error) {
	if err := dialect.Migrate(ctx, b.db, dialect.Postgres, dialect.MigrateOptions{Table: table, SkipInbox: true, Logger: b.quiet}); err != nil {
		return nil, err
	}
	return b.store(db, table, opts)
}

// store opens the outbox on db's table, which outbox migrated before.
func (b *bench) store(db *sql.DB, table string, opts sqlxoutbox.Options) (*sqlxoutbox.Outbox, error) {
	opts.Table = table
	opts.Dialect = dialect.Postgres
	if opts.Logger == nil {
		opts.Logger = b.quiet
	}
	return sqlxoutbox.New(sqlx.NewDb(db, "pgx"), opts)
}

// payloadSQL builds a ~210-byte JSON order, the payload size of
// PERFORMANCE-LIMITS.md, from the integer expression g.
func payloadSQL(g string) string {
	return "jsonb_build_object('order_id', 'o-' || " + g + ", 'customer_id', 'c-' || (" + g + " % 9973)," +
		" 'currency', 'EUR', 'amount_cents', (" + g + " * 37) % 100000, 'status', 'created'," +
		" 'lines', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (" + g + " % 500), 'qty', 1 + " + g + " % 5)," +
		" jsonb_build_object('sku', 'SKU-' || (" + g + " % 77), 'qty', 2)))"
}

// fill empties table and writes n due events with one INSERT ... SELECT,
// then vacuums, so that every run starts from the same state.
func (b *bench) fill(ctx context.Context, table string, n int) error {
	if _, err := b.db.ExecContext(ctx, "TRUNCATE "+table); err != nil {
		return err
	}
	if _, err := b.db.ExecContext(ctx, "INSERT INTO "+table+" (event_id, aggregate_type, aggregate_id, event_type, payload)"+
		" SELECT gen_random_uuid(), 'order', 'o-' || (g % 1000), 'order.created', "+payloadSQL("g")+
		" FROM generate_series(1, $1) AS g", n); err != nil {
		return err
	}
	_, err := b.db.ExecContext(ctx, "VACUUM ANALYZE "+table)
	return err
}

// orderPayload is the producers' business row and event payload, ~210 bytes
// of JSON like payloadSQL's.
func orderPayload(i int) string {
	return fmt.Sprintf(`{"order_id": "o-%d", "customer_id": "c-%d", "currency": "EUR", "amount_cents": %d, "status": "created", "lines": [{"sku": "SKU-%d", "qty": %d}, {"sku": "SKU-%d", "qty": 2}]}`,
		i, i%9973, (i*37)%100000, i%500, 1+i%5, i%77)
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p * float64(len(s)-1))
	return s[i]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
