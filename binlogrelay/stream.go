package binlogrelay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gmysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/go-sql-driver/mysql"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/logstream"
)

// serverTimeout is how long the server may stay silent (it sends a
// heartbeat every second while idle) before the relay drops the connection
// and reconnects.
const serverTimeout = 10 * time.Second

// session streams once: from taking the stream's lock to the first error.
func (r *source) session(ctx context.Context, started func()) error {
	lock, err := r.db.Conn(ctx)
	if err != nil {
		return err
	}
	var database string
	if err := lock.QueryRowContext(ctx, "SELECT "+schemaExpr(r.names)).Scan(&database); err != nil {
		lock.Close()
		return err
	}
	lname := lockName(database, r.names.name)
	var got sql.NullInt64
	if err := lock.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", lname).Scan(&got); err != nil {
		lock.Close()
		return err
	}
	if got.Int64 != 1 {
		lock.Close()
		return errStandby
	}
	defer func() {
		// The connection goes back to the pool: release the lock first,
		// so that a standby takes over now, not when the pool closes it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = lock.ExecContext(rctx, "DO RELEASE_LOCK(?)", lname)
		lock.Close()
	}()
	if err := checkServer(ctx, lock); err != nil {
		return err
	}
	st, err := readStored(ctx, lock, r.names)
	if err != nil {
		return err
	}
	files, err := binaryLogs(ctx, r.db)
	if err != nil {
		return err
	}
	if _, held := behind(files, st.pos, st.pos); !held {
		return fmt.Errorf("%w: stream %s is at %s, and the server's oldest binlog is %s: events written since may be missing; run txoutbox log recover (binlogrelay.Recover) to hand them to the table's retry path",
			ErrBinlogPurged, r.names.name, st.pos, oldestFile(files))
	}
	cols, err := r.columns(ctx, lock)
	if err != nil {
		return err
	}
	syncer, err := newSyncer(ctx, r.db, r.cfg, r.opts.ServerID, onlyInserts(database, r.names.table.Name))
	if err != nil {
		return err
	}
	defer syncer.Close()
	streamer, err := syncer.StartSync(gmysql.Position{Name: st.pos.File, Pos: st.pos.Offset})
	if err != nil {
		return purgedOr(err, st.pos, r.names.name)
	}
	pos := newPositions(st.pos)
	r.stream.Started(pos.ordinal(st.pos))
	started()

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	items := make(chan logstream.Item, 256)
	var wg sync.WaitGroup
	var pubErr, confErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		if pubErr = r.stream.Publish(sctx, items); pubErr != nil {
			cancel()
		}
	}()
	rd := &reader{r: r, database: database, cols: cols, pos: pos, out: items}
	c := &confirmer{r: r, rd: rd, lock: lock, lname: lname, stored: pos.ordinal(st.pos), storedAt: time.Now()}
	go func() {
		defer wg.Done()
		if confErr = c.run(sctx); confErr != nil {
			cancel()
		}
	}()
	recvErr := rd.read(sctx, streamer)
	cancel()
	wg.Wait()
	if ctx.Err() != nil && confErr == nil {
		// A graceful stop: store what the broker took, at once, so that
		// the next relay sends none of it again.
		fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer fcancel()
		if err := c.store(fctx, true); err != nil {
			r.stream.Logger().Warn("txoutbox: log: could not store the position at stop; the next relay sends the last events again", "error", err)
		}
	}
	return errors.Join(pubErr, confErr, purgedOr(recvErr, st.pos, r.names.name))
}

// newSyncer returns a binlog reader on cfg's server, as a replica with
// serverID (random when 0), whose rows events are decoded by decode.
func newSyncer(ctx context.Context, db *sql.DB, cfg *mysql.Config, serverID uint32, decode func(*replication.RowsEvent, []byte) error) (*replication.BinlogSyncer, error) {
	maria, err := isMariaDB(ctx, db)
	if err != nil {
		return nil, err
	}
	flavor := gmysql.MySQLFlavor
	if maria {
		flavor = gmysql.MariaDBFlavor
	}
	host, port, err := splitHostPort(cfg.Addr)
	if err != nil {
		return nil, err
	}
	if serverID == 0 {
		serverID = randomServerID()
	}
	return replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID: serverID, Flavor: flavor, Host: host, Port: port, User: cfg.User, Password: cfg.Passwd,
		TLSConfig: cfg.TLS, HeartbeatPeriod: time.Second, ReadTimeout: serverTimeout, DisableRetrySync: true,
		Logger: slog.New(slog.DiscardHandler), RowsEventDecodeFunc: decode,
	}), nil
}

// onlyInserts decodes the rows of inserts into database.table and only
// their header (which table) for every other rows event: the binlog of a
// busy server is mostly other tables' rows, which the stream skips.
func onlyInserts(database, table string) func(*replication.RowsEvent, []byte) error {
	return func(e *replication.RowsEvent, data []byte) error {
		pos, err := e.DecodeHeader(data)
		if err != nil {
			return err
		}
		if e.Type() != replication.EnumRowsEventTypeInsert || string(e.Table.Schema) != database || string(e.Table.Table) != table {
			return nil
		}
		return e.DecodeData(pos, data)
	}
}

// purgedOr maps the server's "could not find first log file" (1236) to
// ErrBinlogPurged.
func purgedOr(err error, p Position, name string) error {
	var me *gmysql.MyError
	if errors.As(err, &me) && me.Code == gmysql.ER_MASTER_FATAL_ERROR_READING_BINLOG {
		return fmt.Errorf("%w: stream %s at %s: %s; run txoutbox log recover (binlogrelay.Recover)", ErrBinlogPurged, name, p, me.Message)
	}
	return err
}

func oldestFile(files []binlogFile) string {
	if len(files) == 0 {
		return "none"
	}
	return files[0].name
}

func splitHostPort(addr string) (string, uint16, error) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return addr, 3306, nil
	}
	p, err := strconv.ParseUint(addr[i+1:], 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("binlogrelay: address %q: %w", addr, err)
	}
	return strings.Trim(addr[:i], "[]"), uint16(p), nil
}

// columns reads the outbox table's columns in their order, for a binlog
// without column names (binlog_row_metadata MINIMAL).
func (r *source) columns(ctx context.Context, q interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}) ([]string, error) {
	rows, err := q.QueryContext(ctx, "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "+schemaExpr(r.names)+
		" AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION", r.names.table.Name)
	if err != nil {
		return nil, fmt.Errorf("binlogrelay: read the table's columns: %w", err)
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, err
		}
		cols = append(cols, strings.ToLower(c))
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(cols) == 0 {
		return nil, fmt.Errorf("%w: %s", errNoTable, r.names.table)
	}
	return cols, nil
}

var errNoTable = errors.New("binlogrelay: the outbox table does not exist")

// positions maps the binlog's files to the stream's ordinals: a position
// is its file's sequence number above the offset, so that later is
// greater across rotations.
type positions struct {
	mu    sync.Mutex
	files map[uint32]string
}

func newPositions(start Position) *positions {
	p := &positions{files: map[uint32]string{}}
	p.add(start.File)
	return p
}

func fileSeq(name string) uint32 {
	i := strings.LastIndexByte(name, '.')
	n, _ := strconv.ParseUint(name[i+1:], 10, 32)
	return uint32(n)
}

func (p *positions) add(file string) {
	p.mu.Lock()
	p.files[fileSeq(file)] = file
	p.mu.Unlock()
}

func (p *positions) ordinal(pos Position) uint64 {
	return uint64(fileSeq(pos.File))<<32 | uint64(pos.Offset)
}

func (p *positions) position(ord uint64) Position {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Position{File: p.files[uint32(ord>>32)], Offset: uint32(ord)}
}

// reader decodes the binlog into items: one per committed transaction.
type reader struct {
	r        *source
	database string
	cols     []string
	pos      *positions
	out      chan<- logstream.Item
	// foreign is the End of the latest transaction that was not only the
	// stream's own position write; committed the latest one with events,
	// for the position's event time.
	foreign atomic.Uint64
	events  sync.Mutex
	withEv  []evMark
}

// evMark is a transaction with events: its end and commit time.
type evMark struct {
	end    uint64
	commit time.Time
}

// txn is the transaction being read.
type txn struct {
	events  []core.Event
	foreign bool // it wrote something else than the positions table
}

func (rd *reader) read(ctx context.Context, s *replication.BinlogStreamer) error {
	var (
		file = rd.pos.position(rd.r.stream.Confirmed()).File
		cur  *txn
	)
	commit := func(logPos uint32) error {
		t := cur
		cur = nil
		if t == nil {
			t = &txn{foreign: true}
		}
		end := rd.pos.ordinal(Position{File: file, Offset: logPos})
		it := logstream.Item{End: end}
		it.Events = t.events
		for _, ev := range t.events {
			if ev.CreatedAt.After(it.Commit) {
				it.Commit = ev.CreatedAt
			}
		}
		if t.foreign {
			rd.foreign.Store(end)
		}
		if len(it.Events) > 0 {
			rd.events.Lock()
			rd.withEv = append(rd.withEv, evMark{end, it.Commit})
			rd.events.Unlock()
		}
		rd.r.stream.Received(it)
		select {
		case rd.out <- it:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for {
		ev, err := s.GetEvent(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		h := ev.Header
		switch e := ev.Event.(type) {
		case *replication.RotateEvent:
			file = string(e.NextLogName)
			rd.pos.add(file)
		case *replication.MariadbGTIDEvent, *replication.GTIDEvent:
			cur = &txn{}
		case *replication.QueryEvent:
			switch q := strings.TrimSpace(string(e.Query)); {
			case strings.EqualFold(q, "BEGIN"):
				if cur == nil {
					cur = &txn{}
				}
			case strings.EqualFold(q, "COMMIT"):
				if err := commit(h.LogPos); err != nil {
					return err
				}
			default:
				// DDL and other statements are transactions of their own.
				if strings.Contains(strings.ToLower(q), strings.ToLower(rd.r.names.table.Name)) {
					rd.cols = nil // the table may have changed: read its columns again
				}
				if cur == nil || len(cur.events) == 0 {
					if cur != nil {
						cur.foreign = true
					}
					if err := commit(h.LogPos); err != nil {
						return err
					}
				}
			}
		case *replication.RowsEvent:
			if cur == nil {
				cur = &txn{}
			}
			schema, table := string(e.Table.Schema), string(e.Table.Table)
			switch {
			case schema == rd.database && table == PositionsTable:
			case schema == rd.database && table == rd.r.names.table.Name:
				cur.foreign = true
				if e.Type() != replication.EnumRowsEventTypeInsert {
					continue
				}
				rows, err := rd.decode(ctx, e)
				if err != nil {
					return err
				}
				cur.events = append(cur.events, rows...)
			default:
				cur.foreign = true
			}
		case *replication.XIDEvent:
			if err := commit(h.LogPos); err != nil {
				return err
			}
		}
	}
}

// decode turns an insert's rows into events: those handed to the log
// (published_at set by its default), not the rows the relay itself wrote
// to the table (published_at NULL).
func (rd *reader) decode(ctx context.Context, e *replication.RowsEvent) ([]core.Event, error) {
	names := e.Table.ColumnNameString()
	if len(names) == 0 {
		if rd.cols == nil || len(rd.cols) != int(e.Table.ColumnCount) {
			cols, err := rd.r.columns(ctx, rd.r.db)
			if err != nil {
				return nil, err
			}
			rd.cols = cols
		}
		if len(rd.cols) != int(e.Table.ColumnCount) {
			return nil, fmt.Errorf("binlogrelay: the binlog's rows of %s have %d columns, the table %d (it changed since): set binlog_row_metadata = FULL so that the binlog names its columns",
				rd.r.names.table, e.Table.ColumnCount, len(rd.cols))
		}
		names = rd.cols
	}
	var out []core.Event
	for _, row := range e.Rows {
		ev, ok, err := decodeRow(names, row)
		if err != nil {
			return nil, fmt.Errorf("binlogrelay: decode a row of %s: %w", rd.r.names.table, err)
		}
		if ok {
			out = append(out, ev)
		}
	}
	return out, nil
}

// eventTime returns the commit time of the latest transaction with events
// up to end (zero when none), and with pop forgets those transactions.
func (rd *reader) eventTime(end uint64, pop bool) time.Time {
	rd.events.Lock()
	defer rd.events.Unlock()
	var t time.Time
	i := 0
	for ; i < len(rd.withEv) && rd.withEv[i].end <= end; i++ {
		t = rd.withEv[i].commit
	}
	if pop {
		rd.withEv = rd.withEv[i:]
	}
	return t
}

// confirmer stores the stream's handled position, through the connection
// that holds the stream's lock: a relay that lost its lock (its session
// ended on the server) can store nothing.
type confirmer struct {
	r        *source
	rd       *reader
	lock     *sql.Conn
	lname    string
	stored   uint64
	storedAt time.Time
}

func (c *confirmer) run(ctx context.Context) error {
	t := time.NewTicker(c.r.opts.ConfirmInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			// A stop must not cut a store in half: the driver would
			// close the lock's connection, and the final store at stop
			// (which sends nothing twice) could not run.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), serverTimeout)
			err := c.store(sctx, false)
			cancel()
			if err != nil {
				return err
			}
		}
	}
}

// errLockLost ends a session whose lock the server released (its
// connection was lost): another relay may stream now.
var errLockLost = errors.New("binlogrelay: the stream's lock was lost")

// store stores the handled position: at once when it passed events, at
// most once a second when it passed only other tables' writes, never for
// the stream's own position writes alone (which would store forever).
func (c *confirmer) store(ctx context.Context, final bool) error {
	target := c.r.stream.Confirmed()
	if target <= c.stored {
		return nil
	}
	if c.rd.eventTime(target, false).IsZero() {
		if c.rd.foreign.Load() <= c.stored || (!final && time.Since(c.storedAt) < time.Second) {
			return nil
		}
	}
	evTime := c.rd.eventTime(target, true)
	p := c.rd.pos.position(target)
	var et any
	if !evTime.IsZero() {
		et = evTime.UTC()
	}
	res, err := c.lock.ExecContext(ctx, "UPDATE "+c.r.names.positions+" SET file = ?, pos = ?, event_time = COALESCE(?, event_time), updated_at = UTC_TIMESTAMP(6)"+
		" WHERE name = ? AND IS_USED_LOCK(?) = CONNECTION_ID()", p.File, p.Offset, et, c.r.names.name, c.lname)
	if err != nil {
		return fmt.Errorf("binlogrelay: store the position: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		if _, err := readStored(ctx, c.lock, c.r.names); err != nil {
			return err
		}
		return errLockLost
	}
	c.stored, c.storedAt = target, time.Now()
	c.r.stream.Confirmation()
	return nil
}
