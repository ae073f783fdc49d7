package binlogrelay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	gmysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/go-sql-driver/mysql"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// WatcherOptions configures a Watcher.
type WatcherOptions struct {
	// Table is the outbox table whose inserts wake the target. Default
	// dialect.DefaultTable.
	Table string
	// ServerID is the replica server id the watcher reads the binlog as.
	// Default: a random id per connection.
	ServerID uint32
	// MaxBackoff bounds the wait between reconnections. Default 10s.
	MaxBackoff time.Duration
	// Logger receives the watcher's state changes. Default slog.Default().
	Logger *slog.Logger
}

// WatcherStats are a Watcher's totals.
type WatcherStats struct {
	// Wakes counts transactions that inserted into the table (each one
	// called the target's Notify).
	Wakes int64
	// Connects counts binlog connections (the first and reconnections).
	Connects int64
}

// Watcher wakes a table-mode relay in another process than the producers
// within milliseconds of their commits, by reading the binlog as a replica
// does: every committed transaction that inserted into the outbox table
// calls the target's Notify (a *core.Relay). Producers need nothing, not
// even a NOTIFY: the binlog is the signal, and only committed transactions
// are in it.
//
// It reads from the server's current position on every connection and
// wakes the target once after each, for what it may have missed. Where the
// binlog is off or the user lacks REPLICATION SLAVE and BINLOG MONITOR
// (REPLICATION CLIENT on MySQL), Run logs it once and returns nil: the
// relay's poll interval remains, as it does after any lost wake-up.
//
//	relay, _ := core.NewRelay(outbox, pub, core.RelayOptions{PollInterval: 5 * time.Second})
//	w, _ := binlogrelay.NewWatcher(dsn, relay, binlogrelay.WatcherOptions{})
//	go w.Run(ctx)
//	relay.Run(ctx)
type Watcher struct {
	target core.Notifier
	cfg    *mysql.Config
	db     *sql.DB
	table  dialect.Identifier
	opts   WatcherOptions
	log    *slog.Logger
	ready  chan struct{}
	wakes  atomic.Int64
	conns  atomic.Int64
}

// ErrUnavailable is wrapped by the reason a Watcher cannot read the binlog
// (binlog off, missing privilege): Run logs it and returns nil.
var ErrUnavailable = errors.New("binlogrelay: the binlog cannot be read for wake-ups")

// NewWatcher returns a watcher of dsn's outbox table (the driver's DSN)
// that wakes target.
func NewWatcher(dsn string, target core.Notifier, opts WatcherOptions) (*Watcher, error) {
	if target == nil {
		return nil, fmt.Errorf("%w: binlogrelay.NewWatcher needs a target", core.ErrInvalidOptions)
	}
	if opts.Table == "" {
		opts.Table = dialect.DefaultTable
	}
	id, err := dialect.ValidateIdentifier(opts.Table)
	if err != nil {
		return nil, fmt.Errorf("%w: binlogrelay: table: %w", core.ErrInvalidOptions, err)
	}
	if opts.MaxBackoff < 0 {
		return nil, fmt.Errorf("%w: binlogrelay: negative MaxBackoff", core.ErrInvalidOptions)
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	db, cfg, err := open(dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return &Watcher{target: target, cfg: cfg, db: db, table: id, opts: opts, log: opts.Logger, ready: make(chan struct{})}, nil
}

// Ready is closed once the watcher reads the binlog for the first time.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Stats returns the watcher's totals.
func (w *Watcher) Stats() WatcherStats {
	return WatcherStats{Wakes: w.wakes.Load(), Connects: w.conns.Load()}
}

// Run watches until ctx ends. It returns nil when ctx ends and when the
// binlog cannot be read (it logs why, once); connection failures are
// retried with backoff, logged once until the watcher reads again.
func (w *Watcher) Run(ctx context.Context) error {
	defer w.db.Close()
	wait := 100 * time.Millisecond
	var lost time.Time
	for {
		err := w.session(ctx, func() {
			if !lost.IsZero() {
				w.log.Info("txoutbox: binlog wake-up reads again", "table", w.table, "after", time.Since(lost).Round(time.Millisecond))
			}
			lost, wait = time.Time{}, 100*time.Millisecond
		})
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrUnavailable) {
			w.log.Warn("txoutbox: no binlog wake-up; the relay polls every poll interval instead", "table", w.table, "reason", err)
			return nil
		}
		if lost.IsZero() {
			lost = time.Now()
			w.log.Warn("txoutbox: binlog wake-up lost; reconnecting with backoff (logged once until it reads again)", "table", w.table, "error", err)
		}
		if !sleepCtx(ctx, wait) {
			return nil
		}
		wait = min(2*wait, w.opts.MaxBackoff)
	}
}

func (w *Watcher) session(ctx context.Context, reading func()) error {
	if err := checkServer(ctx, w.db); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	start, err := serverPosition(ctx, w.db)
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && (me.Number == 1227 || me.Number == 1045) { // access denied
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	var database string
	if err := w.db.QueryRowContext(ctx, "SELECT "+schemaExpr(resolved{table: w.table})).Scan(&database); err != nil {
		return err
	}
	syncer, err := newSyncer(ctx, w.db, w.cfg, w.opts.ServerID, onlyInserts(database, w.table.Name))
	if err != nil {
		return err
	}
	defer syncer.Close()
	s, err := syncer.StartSync(gmysql.Position{Name: start.File, Pos: start.Offset})
	if err != nil {
		return denied(err)
	}
	w.conns.Add(1)
	reading()
	select {
	case <-w.ready:
	default:
		close(w.ready)
	}
	// What committed while the watcher was not reading.
	w.target.Notify()
	inserted := false
	for {
		ev, err := s.GetEvent(ctx)
		if err != nil {
			return denied(err)
		}
		switch e := ev.Event.(type) {
		case *replication.RowsEvent:
			if len(e.Rows) > 0 { // decoded: an insert into the table
				inserted = true
			}
		case *replication.XIDEvent:
			if inserted {
				inserted = false
				w.wakes.Add(1)
				w.target.Notify()
			}
		case *replication.QueryEvent:
			if inserted && string(e.Query) == "COMMIT" {
				inserted = false
				w.wakes.Add(1)
				w.target.Notify()
			}
		}
	}
}

// denied marks the server's refusal of a replica connection (no
// REPLICATION SLAVE) as ErrUnavailable.
func denied(err error) error {
	var me *gmysql.MyError
	if errors.As(err, &me) && (me.Code == gmysql.ER_SPECIFIC_ACCESS_DENIED_ERROR || me.Code == gmysql.ER_ACCESS_DENIED_ERROR) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
