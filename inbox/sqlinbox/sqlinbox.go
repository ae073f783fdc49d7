// Package sqlinbox is the inbox (core.Inbox) on database/sql and sqlx, for
// PostgreSQL, MySQL/MariaDB and SQLite: Process records (consumer, event_id) in the table
// processed_events and runs the handler in the same transaction, which the
// handler reaches with Tx or Txx. Use it with inbox.NewMiddleware:
//
//	ib, err := sqlinbox.New(db, sqlinbox.Options{})
//	dedup, err := inbox.NewMiddleware(ib, inbox.Options{Consumer: "inventory"})
//	router.AddMiddleware(dedup)
//
// Package gorminbox is the same on GORM, in its own package so that each
// consumer compiles only its own database library.
package sqlinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/lockretry"
)

// DB is what New needs from a database handle. *sql.DB and *sqlx.DB
// satisfy it.
type DB interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// sqlxBeginner is the part of *sqlx.DB that lets handlers use Txx.
type sqlxBeginner interface {
	BeginTxx(ctx context.Context, opts *sql.TxOptions) (*sqlx.Tx, error)
}

// Options configures New.
type Options struct {
	// Dialect is dialect.Postgres, dialect.MySQL or dialect.SQLite. The
	// zero value detects it from the handle: the driver name of a *sqlx.DB,
	// the driver type of a *sql.DB (pgx, pq, go-sql-driver/mysql,
	// modernc.org/sqlite, mattn/go-sqlite3).
	Dialect dialect.Dialect
	// Table is the inbox table, optionally schema-qualified. Default
	// dialect.DefaultInboxTable ("processed_events"). Create it with
	// dialect.Migrate (MigrateOptions.InboxTable, SkipOutbox for a
	// consumer-only database).
	Table string
	// TxOptions are passed to BeginTx. Default nil: the database's default
	// isolation (READ COMMITTED on PostgreSQL, REPEATABLE READ on MySQL),
	// under which a concurrent duplicate waits for the first delivery's
	// transaction and then skips. (On MySQL the INSERT's duplicate-key
	// check locks the key whatever the isolation, so REPEATABLE READ's gap
	// locks change nothing for the inbox row; they do apply to the
	// handler's own reads.)
	// Under REPEATABLE READ or SERIALIZABLE it fails with a serialization
	// error instead, which the router turns into a redelivery that then
	// skips: still one effect, one more round trip.
	TxOptions *sql.TxOptions
	// BusyTimeout bounds how long Process retries, before the handler
	// ran, when SQLite is locked by another writer (the connection's own
	// busy_timeout pragma is the first line; this covers a DSN without it)
	// or when MySQL chose the record's INSERT as a deadlock victim.
	// Default 30s. Unused on PostgreSQL.
	BusyTimeout time.Duration
	// Logger receives warnings about the configuration. Default
	// slog.Default().
	Logger *slog.Logger
}

// Inbox is a core.Inbox on database/sql, for PostgreSQL, MySQL/MariaDB and
// SQLite. It also
// deletes old records (DeleteProcessed) for inbox.Cleanup.
type Inbox struct {
	db     DB
	sqlx   sqlxBeginner // nil unless db is a *sqlx.DB
	q      *dialect.InboxQueries
	d      dialect.Dialect
	opts   Options
	sqlite bool
}

var _ core.Inbox = (*Inbox)(nil)

// New returns an inbox that records processed events in opts.Table through
// db. It does not create the table: run dialect.Migrate (or txoutbox
// migrate) first.
func New(db DB, opts Options) (*Inbox, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: sqlinbox.New needs a database handle", core.ErrInvalidOptions)
	}
	if opts.BusyTimeout < 0 {
		return nil, fmt.Errorf("%w: negative sqlinbox.Options.BusyTimeout", core.ErrInvalidOptions)
	}
	if opts.BusyTimeout == 0 {
		opts.BusyTimeout = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Table == "" {
		opts.Table = dialect.DefaultInboxTable
	}
	if opts.Dialect.IsZero() {
		d, ok := detectDialect(db)
		if !ok {
			return nil, fmt.Errorf("%w: sqlinbox.New cannot tell the database of %T; set Options.Dialect", core.ErrInvalidOptions, db)
		}
		opts.Dialect = d
	}
	q, err := opts.Dialect.InboxQueries(opts.Table)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", core.ErrInvalidOptions, err)
	}
	s := &Inbox{db: db, q: q, d: opts.Dialect, opts: opts, sqlite: opts.Dialect == dialect.SQLite}
	if b, ok := db.(sqlxBeginner); ok {
		s.sqlx = b
	}
	return s, nil
}

// Table returns the inbox table's name, as configured.
func (s *Inbox) Table() string { return s.opts.Table }

// Dialect returns the dialect in use, configured or detected.
func (s *Inbox) Dialect() dialect.Dialect { return s.d }

// CheckSQLite warns through the logger when db is SQLite and the connection
// it gets has no busy_timeout: then a second writer fails at once with
// "database is locked" instead of waiting, which Process absorbs only for its
// own first statement. Set it in the DSN for every connection, e.g.
// "file:app.db?_pragma=busy_timeout(10000)" with modernc.org/sqlite. It
// returns the timeout found (0 on PostgreSQL).
func (s *Inbox) CheckSQLite(ctx context.Context) (time.Duration, error) {
	if !s.sqlite {
		return 0, nil
	}
	var ms int64
	if err := s.db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&ms); err != nil {
		return 0, fmt.Errorf("sqlinbox: read busy_timeout: %w", err)
	}
	if ms == 0 {
		s.opts.Logger.Warn("txoutbox: SQLite connection has no busy_timeout; concurrent writers fail with SQLITE_BUSY instead of waiting",
			"hint", "add _pragma=busy_timeout(10000) to the DSN")
	}
	return time.Duration(ms) * time.Millisecond, nil
}

type txValue struct {
	tx  *sql.Tx
	txx *sqlx.Tx
}

type txKey struct{}

// Tx returns the transaction that the inbox opened for the handler whose
// context ctx is, or nil outside such a handler. Write the handler's effects
// through it, not through the *sql.DB: only then do they commit or roll back
// with the inbox record (and, on SQLite, a second connection would wait for
// the lock this transaction holds).
func Tx(ctx context.Context) *sql.Tx {
	v, _ := ctx.Value(txKey{}).(*txValue)
	if v == nil {
		return nil
	}
	return v.tx
}

// Txx is Tx for sqlx: the *sqlx.Tx when the inbox was made on a *sqlx.DB,
// and nil otherwise (a *sqlx.Tx needs the driver name that only *sqlx.DB
// knows).
func Txx(ctx context.Context) *sqlx.Tx {
	v, _ := ctx.Value(txKey{}).(*txValue)
	if v == nil {
		return nil
	}
	return v.txx
}

// ContextWithTx returns ctx carrying tx as Tx and Txx find it, for testing
// a handler without the middleware. txx may be nil.
func ContextWithTx(ctx context.Context, tx *sql.Tx, txx *sqlx.Tx) context.Context {
	if txx != nil && tx == nil {
		tx = txx.Tx
	}
	return context.WithValue(ctx, txKey{}, &txValue{tx: tx, txx: txx})
}

// Process implements core.Inbox: it records (consumer, eventID) and runs fn
// in one transaction, which fn finds with Tx or Txx. It returns (false, nil)
// without running fn when the pair was recorded before. An error or panic of
// fn rolls the transaction back; the error is returned as it is, the panic
// goes on.
func (s *Inbox) Process(ctx context.Context, consumer, eventID string, fn func(ctx context.Context) error) (processed bool, err error) {
	if consumer == "" {
		return false, fmt.Errorf("%w: sqlinbox: empty consumer", core.ErrInvalidOptions)
	}
	if eventID == "" {
		return false, core.ErrMissingEventID
	}
	if err := dialect.CheckInboxKey(consumer, eventID); err != nil {
		return false, err
	}
	v, inserted, err := s.record(ctx, consumer, eventID)
	if err != nil {
		return false, err
	}
	if !inserted {
		// Already processed (and committed) by an earlier delivery. Nothing
		// was written, so the rollback only ends the transaction.
		_ = v.tx.Rollback()
		return false, nil
	}
	done := false
	defer func() {
		if !done {
			_ = v.tx.Rollback() // fn panicked
		}
	}()
	if err := fn(context.WithValue(ctx, txKey{}, v)); err != nil {
		done = true
		if rerr := v.tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
			return false, errors.Join(err, fmt.Errorf("sqlinbox: rollback: %w", rerr))
		}
		return false, err
	}
	done = true
	if err := v.tx.Commit(); err != nil {
		// Unknown outcome at worst (connection lost during COMMIT): the
		// redelivery then either skips or processes, never both.
		return false, fmt.Errorf("sqlinbox: commit event %s for %s: %w", eventID, consumer, err)
	}
	return true, nil
}

// record begins the transaction and inserts the record, retrying on SQLite
// while another writer holds the lock, and on MySQL when the INSERT was a
// deadlock's victim (concurrent duplicates waiting on a delivery that
// rolled back). Retrying is safe because nothing has run yet; later
// statements of the transaction cannot be refused that way on SQLite,
// since the successful INSERT already holds its write lock.
func (s *Inbox) record(ctx context.Context, consumer, eventID string) (*txValue, bool, error) {
	start := time.Now()
	wait := time.Millisecond
	for {
		// With _txlock=immediate in the DSN the lock is taken, and may be
		// refused, at BEGIN already; otherwise at the INSERT.
		v, err := s.begin(ctx)
		if err == nil {
			q, args := s.q.Record(consumer, eventID)
			var res sql.Result
			res, err = v.tx.ExecContext(ctx, q, args...)
			if err == nil {
				n, err := res.RowsAffected()
				if err != nil {
					_ = v.tx.Rollback()
					return nil, false, fmt.Errorf("sqlinbox: rows affected: %w", err)
				}
				return v, n == 1, nil
			}
			_ = v.tx.Rollback()
			err = fmt.Errorf("sqlinbox: record event %s for %s: %w", eventID, consumer, err)
		}
		if !lockretry.Retryable(s.d, err) || time.Since(start) >= s.opts.BusyTimeout {
			return nil, false, err
		}
		// Jittered, so that waiting writers do not wake in lockstep.
		d := wait/2 + rand.N(wait/2+1)
		select {
		case <-ctx.Done():
			return nil, false, fmt.Errorf("sqlinbox: %w (after %w)", ctx.Err(), err)
		case <-time.After(d):
		}
		wait = min(2*wait, 25*time.Millisecond)
	}
}

func (s *Inbox) begin(ctx context.Context) (*txValue, error) {
	if s.sqlx != nil {
		txx, err := s.sqlx.BeginTxx(ctx, s.opts.TxOptions)
		if err != nil {
			return nil, fmt.Errorf("sqlinbox: begin: %w", err)
		}
		return &txValue{tx: txx.Tx, txx: txx}, nil
	}
	tx, err := s.db.BeginTx(ctx, s.opts.TxOptions)
	if err != nil {
		return nil, fmt.Errorf("sqlinbox: begin: %w", err)
	}
	return &txValue{tx: tx}, nil
}

// DeleteProcessed deletes at most limit records processed before the given
// time, of every consumer, and returns how many it deleted. Cleanup calls it
// in a loop.
func (s *Inbox) DeleteProcessed(ctx context.Context, before time.Time, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("%w: DeleteProcessed limit %d", core.ErrInvalidOptions, limit)
	}
	q, args := s.q.DeleteProcessedBefore(before, limit)
	res, err := s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("sqlinbox: delete processed before %s: %w", before.Format(time.RFC3339), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("sqlinbox: rows affected: %w", err)
	}
	return n, nil
}

// Processed reports whether (consumer, eventID) is recorded, for tests and
// tools.
func (s *Inbox) Processed(ctx context.Context, consumer, eventID string) (bool, error) {
	q, args := s.q.Exists(consumer, eventID)
	var one int
	switch err := s.db.QueryRowContext(ctx, q, args...).Scan(&one); {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("sqlinbox: look up event %s for %s: %w", eventID, consumer, err)
	}
	return true, nil
}

// ConsumerStats is what the inbox holds for one consumer.
type ConsumerStats struct {
	Consumer string
	// Processed counts its records (those the retention has kept).
	Processed int64
	// Last is when it processed its latest event.
	Last time.Time
}

// Consumers returns every consumer of the inbox with its record count and
// latest processing time, for operators (the console's inbox page). Each
// count reads that consumer's range of the primary key.
func (s *Inbox) Consumers(ctx context.Context) ([]ConsumerStats, error) {
	names, err := s.consumerNames(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]ConsumerStats, 0, len(names))
	for _, c := range names {
		q, args := s.q.ConsumerStats(c)
		st := ConsumerStats{Consumer: c}
		var last dialect.Time
		if err := s.db.QueryRowContext(ctx, q, args...).Scan(&st.Processed, &last); err != nil {
			return nil, fmt.Errorf("sqlinbox: count %s's records: %w", c, err)
		}
		st.Last = last.Time
		out = append(out, st)
	}
	return out, nil
}

// ProcessedBy returns, for each consumer that processed eventID, when it
// did: one primary-key lookup per consumer.
func (s *Inbox) ProcessedBy(ctx context.Context, eventID string) (map[string]time.Time, error) {
	cs, err := s.consumerNames(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]time.Time{}
	for _, c := range cs {
		q, args := s.q.ProcessedAt(c, eventID)
		var at dialect.Time
		switch err := s.db.QueryRowContext(ctx, q, args...).Scan(&at); {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return nil, fmt.Errorf("sqlinbox: look up event %s for %s: %w", eventID, c, err)
		default:
			out[c] = at.Time
		}
	}
	return out, nil
}

func (s *Inbox) consumerNames(ctx context.Context) ([]string, error) {
	// *sql.DB and *sqlx.DB have it; DB does not ask for it, so that New
	// keeps accepting what it accepted.
	qr, ok := s.db.(interface {
		QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	})
	if !ok {
		return nil, fmt.Errorf("%w: sqlinbox: listing consumers needs a handle with QueryContext (*sql.DB, *sqlx.DB)", core.ErrInvalidOptions)
	}
	rows, err := qr.QueryContext(ctx, s.q.Consumers())
	if err != nil {
		return nil, fmt.Errorf("sqlinbox: list consumers: %w", err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, fmt.Errorf("sqlinbox: list consumers: %w", err)
		}
		names = append(names, c)
	}
	return names, rows.Err()
}
