package binlogrelay

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/logstream"
	"github.com/txoutbox/txoutbox/logmode"
)

// Options configures a log-mode relay on MySQL or MariaDB. Zero fields
// take their defaults.
type Options struct {
	// DSN is the outbox database's, as github.com/go-sql-driver/mysql
	// takes it (user:password@tcp(host:port)/dbname). The relay reads the
	// binlog with the same address and user, and keeps a small pool for
	// the position and the retry path. Required.
	DSN string
	// Names are the table and the stream (Setup created them).
	Names
	// Options are what every log-mode relay takes: the retry path's
	// RelayOptions, StandbyInterval, SpillAfter, HoldOnBrokerDown.
	logmode.Options
	// ConfirmInterval is how often, at most, the stream stores its
	// position while events flow: what a relay killed at any moment sends
	// again is what it published in the last interval and the batch in
	// flight. Default 20ms: 50 small commits a second at most, whatever
	// the event rate.
	// Without events (other tables' writes only) the position is stored
	// at most once a second.
	ConfirmInterval time.Duration
	// ServerID is the replica server id the relay reads the binlog as; it
	// must differ from the server's and its replicas'. Default: a random
	// id per session, above 2^30.
	ServerID uint32
}

// source is the binlog as logmode reads it.
type source struct {
	opts   Options
	names  resolved
	cfg    *mysql.Config
	db     *sql.DB
	stream *logstream.Stream // the session's
	// purged is set when the stored position's binlog is gone.
	purged atomic.Bool

	mu     sync.Mutex
	status Status // latest Lag read
}

// New returns a log-mode relay on the binlog. store is the outbox table's
// store (the retry path's core.Relay claims from it); pub receives the
// events. Run returns an error wrapping ErrNotSetUp or ErrBinlogPurged
// when the stream cannot resume at all.
func New(store core.Store, pub core.Publisher, opts Options) (*logmode.Relay, error) {
	if store == nil || pub == nil {
		return nil, fmt.Errorf("%w: binlogrelay.New needs a store and a publisher", core.ErrInvalidOptions)
	}
	names, err := opts.Names.resolve()
	if err != nil {
		return nil, err
	}
	if opts.DSN == "" {
		return nil, fmt.Errorf("%w: binlogrelay: Options.DSN is required", core.ErrInvalidOptions)
	}
	if opts.ConfirmInterval < 0 {
		return nil, fmt.Errorf("%w: binlogrelay: negative ConfirmInterval", core.ErrInvalidOptions)
	}
	if opts.ConfirmInterval == 0 {
		opts.ConfirmInterval = 20 * time.Millisecond
	}
	db, cfg, err := open(opts.DSN)
	if err != nil {
		return nil, err
	}
	if cfg.Net != "tcp" {
		db.Close()
		return nil, fmt.Errorf("%w: binlogrelay: the DSN must reach the server over TCP (a replica connection), not %s", core.ErrInvalidOptions, cfg.Net)
	}
	// The lock's connection, the position's writes and the retry path.
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	src := &source{opts: opts, names: names, cfg: cfg, db: db}
	r, err := logmode.New(store, pub, src, opts.Options)
	if err != nil {
		db.Close()
		return nil, err
	}
	return r, nil
}

// Describe names the stream, for the log lines.
func (r *source) Describe() (key, name string) { return "stream", r.names.name }

// Table is the outbox table of the retry path.
func (r *source) Table(ropts core.RelayOptions) logstream.Table {
	return newTable(r.db, r.names, ropts)
}

// Session streams the binlog once.
func (r *source) Session(ctx context.Context, s *logstream.Stream, started func()) error {
	r.stream = s // every goroutine of the last session has ended
	return r.session(ctx, started)
}

// Lag is the age of the stored position.
func (r *source) Lag(ctx context.Context) (time.Duration, error) {
	st, err := ReadStatus(ctx, r.db, r.opts.Names)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	r.status = st
	r.mu.Unlock()
	return st.Lag, nil
}

// LastStatus is the stream's state as r's latest Stats read it; ok is
// false when r does not stream a binlog.
func LastStatus(r *logmode.Relay) (st Status, ok bool) {
	src, ok := r.Source().(*source)
	if !ok {
		return Status{}, false
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	return src.status, true
}

// BinlogPurged reports whether r stopped because the binlog file of its
// position is gone (see Recover); false when r does not stream a binlog.
func BinlogPurged(r *logmode.Relay) bool {
	src, ok := r.Source().(*source)
	return ok && src.purged.Load()
}

// Close closes the pool.
func (r *source) Close() { r.db.Close() }

// errStandby ends a session whose lock another relay holds.
var errStandby = errors.New("binlogrelay: another relay holds the stream's lock")

// Classify judges the error that ended a session.
func (r *source) Classify(err error) (logstream.Verdict, string) {
	switch {
	case errors.Is(err, ErrNotSetUp), errors.Is(err, core.ErrNotMigrated):
		return logstream.Fatal, ""
	case errors.Is(err, ErrBinlogPurged):
		r.purged.Store(true)
		return logstream.Fatal, ""
	case errors.Is(err, errStandby):
		return logstream.Standby, err.Error()
	}
	return logstream.Lost, ""
}

// randomServerID is a replica server id for one session, above 2^30 where
// servers' own ids seldom are.
func randomServerID() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return 1<<30 | binary.LittleEndian.Uint32(b[:])>>2
}

// isMariaDB tells the binlog's flavour from the server's version.
func isMariaDB(ctx context.Context, db *sql.DB) (bool, error) {
	var v string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
		return false, err
	}
	return strings.Contains(strings.ToLower(v), "mariadb"), nil
}
