package binlogrelay

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// DefaultName is the default name of a stream: its row in the positions
// table and its lock.
const DefaultName = "txoutbox"

// PositionsTable is the table, in the outbox's database, where each
// stream's position is stored.
const PositionsTable = "txoutbox_log_positions"

// Sentinels of log mode on MySQL.
var (
	// ErrBinlogOff: the server does not write a binlog, or not in row
	// format with full row images.
	ErrBinlogOff = errors.New("binlogrelay: the server's binlog is not on in row format with full row images")
	// ErrNotSetUp: the stream has no stored position (run Setup, or
	// txoutbox log create).
	ErrNotSetUp = errors.New("binlogrelay: log mode is not set up for this stream")
	// ErrBinlogPurged: the server no longer has the binlog file the
	// stream's position is in; the events written since may be missing
	// from the log. Recover hands them to the table's retry path.
	ErrBinlogPurged = errors.New("binlogrelay: the binlog the stream needs was purged")
	// ErrNotDrained: Teardown found the stream behind the switch back to
	// table mode after its wait.
	ErrNotDrained = errors.New("binlogrelay: the stream has not reached the switch back to table mode")
)

// Names are log mode's objects for one outbox table.
type Names struct {
	// Table is the outbox table. Default dialect.DefaultTable.
	Table string
	// Name names the stream: its row in PositionsTable and its lock.
	// Default DefaultName.
	Name string
}

var nameRE = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)

// resolved is Names validated, with what the SQL needs.
type resolved struct {
	table     dialect.Identifier
	name      string
	quoted    string // the outbox table, quoted
	positions string // the positions table, quoted, in the table's schema
}

func (n Names) resolve() (resolved, error) {
	if n.Table == "" {
		n.Table = dialect.DefaultTable
	}
	if n.Name == "" {
		n.Name = DefaultName
	}
	id, err := dialect.ValidateIdentifier(n.Table)
	if err != nil {
		return resolved{}, fmt.Errorf("%w: binlogrelay: table: %w", core.ErrInvalidOptions, err)
	}
	if !nameRE.MatchString(n.Name) {
		return resolved{}, fmt.Errorf("%w: binlogrelay: name %q: want [a-z0-9_]{1,64}", core.ErrInvalidOptions, n.Name)
	}
	return resolved{
		table: id, name: n.Name, quoted: dialect.MySQL.Quote(id),
		positions: dialect.MySQL.Quote(dialect.Identifier{Schema: id.Schema, Name: PositionsTable}),
	}, nil
}

// lockName is the server-wide name of the stream's lock: the database
// and the stream, hashed when longer than the 64 characters a lock name
// may have.
func lockName(database, name string) string {
	s := "txoutbox_log:" + database + "." + name
	if len(s) <= 64 {
		return s
	}
	h := sha256.Sum256([]byte(s))
	return "txoutbox_log:" + hex.EncodeToString(h[:])[:48]
}

// open opens dsn (the driver's DSN, or a mysql:// URL's conversion) with
// the settings binlogrelay's SQL expects.
func open(dsn string) (*sql.DB, *mysql.Config, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: binlogrelay: DSN: %w", core.ErrInvalidOptions, err)
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: binlogrelay: DSN: %w", core.ErrInvalidOptions, err)
	}
	return sql.OpenDB(conn), cfg, nil
}

// checkServer refuses a server whose binlog log mode cannot read.
func checkServer(ctx context.Context, q queryer) error {
	var logBin int
	var format, image string
	if err := q.QueryRowContext(ctx, "SELECT @@log_bin, @@binlog_format, @@binlog_row_image").Scan(&logBin, &format, &image); err != nil {
		return fmt.Errorf("binlogrelay: read the binlog settings: %w", err)
	}
	if logBin != 1 || !strings.EqualFold(format, "ROW") || !strings.EqualFold(image, "FULL") {
		return fmt.Errorf("%w (log_bin %d, binlog_format %s, binlog_row_image %s): start the server with log_bin, binlog_format=ROW and binlog_row_image=FULL",
			ErrBinlogOff, logBin, format, image)
	}
	return nil
}

// queryer is a *sql.DB, *sql.Conn or *sql.Tx.
type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Position is a place in the server's binlog.
type Position struct {
	File   string
	Offset uint32
}

func (p Position) String() string { return p.File + ":" + strconv.FormatUint(uint64(p.Offset), 10) }

// serverPosition is the end of the server's binlog (SHOW MASTER STATUS,
// which needs BINLOG MONITOR or REPLICATION CLIENT).
func serverPosition(ctx context.Context, db *sql.DB) (Position, error) {
	rows, err := db.QueryContext(ctx, "SHOW MASTER STATUS")
	if err != nil {
		return Position{}, fmt.Errorf("binlogrelay: SHOW MASTER STATUS (the user needs BINLOG MONITOR on MariaDB, REPLICATION CLIENT on MySQL): %w", err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return Position{}, err
		}
		return Position{}, fmt.Errorf("%w: SHOW MASTER STATUS is empty", ErrBinlogOff)
	}
	cols, err := rows.Columns()
	if err != nil {
		return Position{}, err
	}
	var p Position
	dest := make([]any, len(cols))
	dest[0], dest[1] = &p.File, &p.Offset
	for i := 2; i < len(dest); i++ {
		dest[i] = new(sql.RawBytes)
	}
	if err := rows.Scan(dest...); err != nil {
		return Position{}, err
	}
	return p, rows.Err()
}

// binlogFile is one file of SHOW BINARY LOGS.
type binlogFile struct {
	name string
	size int64
}

// binaryLogs lists the server's binlog files, oldest first.
func binaryLogs(ctx context.Context, db *sql.DB) ([]binlogFile, error) {
	rows, err := db.QueryContext(ctx, "SHOW BINARY LOGS")
	if err != nil {
		return nil, fmt.Errorf("binlogrelay: SHOW BINARY LOGS: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	var files []binlogFile
	for rows.Next() {
		var f binlogFile
		dest := make([]any, len(cols))
		dest[0], dest[1] = &f.name, &f.size
		for i := 2; i < len(dest); i++ {
			dest[i] = new(sql.RawBytes)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, rows.Err()
}

const positionsDDL = `CREATE TABLE IF NOT EXISTS %s (
    name        VARCHAR(64)  NOT NULL,
    file        VARCHAR(255) NOT NULL,
    pos         BIGINT       NOT NULL,
    event_time  DATETIME(6)  NULL,
    updated_at  DATETIME(6)  NOT NULL,
    PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin`

// defaultSQL is published_at's default in log mode: a producer's row is
// handed to the log at its insert.
const defaultSQL = "UTC_TIMESTAMP(6)"

// Setup prepares a MySQL or MariaDB database for log mode, idempotently, in
// this order: it checks the server's binlog settings, creates the
// positions table, stores the server's current binlog position as the
// stream's start (if it has none), then gives the outbox table's
// published_at column its log-mode default. The position comes before the
// default so that every row born handed to the log is after the start.
// The outbox table must exist (dialect.Migrate).
//
// The user needs CREATE and ALTER on the database, and BINLOG MONITOR
// (MariaDB) or REPLICATION CLIENT (MySQL).
func Setup(ctx context.Context, dsn string, n Names) error {
	r, err := n.resolve()
	if err != nil {
		return err
	}
	db, _, err := open(dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := checkServer(ctx, db); err != nil {
		return err
	}
	if err := checkTable(ctx, db, r); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf(positionsDDL, r.positions)); err != nil {
		return fmt.Errorf("binlogrelay: setup: create %s: %w", PositionsTable, err)
	}
	var exists int
	err = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+r.positions+" WHERE name = ?", r.name).Scan(&exists)
	if err != nil {
		return fmt.Errorf("binlogrelay: setup: %w", err)
	}
	if exists == 0 {
		p, err := serverPosition(ctx, db)
		if err != nil {
			return err
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO "+r.positions+" (name, file, pos, updated_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6))",
			r.name, p.File, p.Offset); err != nil {
			return fmt.Errorf("binlogrelay: setup: store the start position: %w", err)
		}
	}
	set, err := defaultIsSet(ctx, db, r)
	if err != nil || set {
		return err
	}
	if _, err := db.ExecContext(ctx, "ALTER TABLE "+r.quoted+" ALTER COLUMN published_at SET DEFAULT ("+defaultSQL+")"); err != nil {
		return fmt.Errorf("binlogrelay: setup: set published_at's default: %w", err)
	}
	return nil
}

// checkTable fails with core.ErrNotMigrated when the outbox table does not
// exist.
func checkTable(ctx context.Context, q queryer, r resolved) error {
	var n int
	err := q.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = "+schemaExpr(r)+" AND TABLE_NAME = ?", r.table.Name).Scan(&n)
	if err != nil {
		return fmt.Errorf("binlogrelay: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %s", core.ErrNotMigrated, r.table)
	}
	return nil
}

// schemaExpr is the SQL of the table's schema: its own, or the
// connection's database.
func schemaExpr(r resolved) string {
	if r.table.Schema != "" {
		return "'" + strings.ReplaceAll(r.table.Schema, "'", "''") + "'"
	}
	return "DATABASE()"
}

// defaultIsSet reports whether published_at has the log-mode default.
func defaultIsSet(ctx context.Context, q queryer, r resolved) (bool, error) {
	var def sql.NullString
	err := q.QueryRowContext(ctx, "SELECT COLUMN_DEFAULT FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "+schemaExpr(r)+
		" AND TABLE_NAME = ? AND COLUMN_NAME = 'published_at'", r.table.Name).Scan(&def)
	if errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("%w: %s has no published_at column", core.ErrNotMigrated, r.table)
	}
	if err != nil {
		return false, fmt.Errorf("binlogrelay: read published_at's default: %w", err)
	}
	return def.Valid && strings.Contains(strings.ToLower(def.String), "utc_timestamp"), nil
}

// stored is a stream's row of the positions table.
type stored struct {
	pos       Position
	eventTime sql.NullTime
	updatedAt time.Time
}

func readStored(ctx context.Context, q queryer, r resolved) (stored, error) {
	var s stored
	var off int64
	var eventTime sql.NullString
	var updatedAt string
	// Times as text, so that a pool without parseTime reads them too.
	err := q.QueryRowContext(ctx, "SELECT file, pos, DATE_FORMAT(event_time, '%Y-%m-%d %H:%i:%s.%f'), DATE_FORMAT(updated_at, '%Y-%m-%d %H:%i:%s.%f')"+
		" FROM "+r.positions+" WHERE name = ?", r.name).Scan(&s.pos.File, &off, &eventTime, &updatedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("%w: stream %s (create it with txoutbox log create)", ErrNotSetUp, r.name)
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1146 { // no such table
		return s, fmt.Errorf("%w: no %s table (create it with txoutbox log create)", ErrNotSetUp, PositionsTable)
	}
	if err != nil {
		return s, fmt.Errorf("binlogrelay: read the stream's position: %w", err)
	}
	s.pos.Offset = uint32(off)
	if s.updatedAt, err = time.ParseInLocation(datetimeLayout, updatedAt, time.UTC); err != nil {
		return s, fmt.Errorf("binlogrelay: read the stream's position: %w", err)
	}
	if eventTime.Valid {
		t, err := time.ParseInLocation(datetimeLayout, eventTime.String, time.UTC)
		if err != nil {
			return s, fmt.Errorf("binlogrelay: read the stream's position: %w", err)
		}
		s.eventTime = sql.NullTime{Time: t, Valid: true}
	}
	return s, nil
}

// Status is log mode's state on the server.
type Status struct {
	Name string
	// Exists is false when the stream has no stored position; the other
	// fields are then zero.
	Exists bool
	// DefaultSet: producers' rows are handed to the log (published_at's
	// default).
	DefaultSet bool
	// Position is where the stream resumes; EventTime the commit time
	// (to the second, as the binlog keeps it) of the last transaction with
	// events before it; StoredAt when it was stored.
	Position  Position
	EventTime time.Time
	StoredAt  time.Time
	// Server is the end of the server's binlog.
	Server Position
	// BehindBytes is the binlog written since Position (summed over the
	// files between them). A few hundred bytes when caught up: the
	// position's own write comes after it.
	BehindBytes int64
	// Lag is how long the stream has not stored a position while the
	// binlog has more than its own writes after it; 0 when caught up.
	Lag time.Duration
	// FilesHeld: the server still has the binlog file of Position. When
	// false the stream cannot resume (ErrBinlogPurged).
	FilesHeld bool
	// Streaming: a relay holds the stream's lock, from the server
	// connection StreamingConnection.
	Streaming           bool
	StreamingConnection int64
}

// ownWriteSlack is how far behind the server a caught-up stream's stored
// position is: the position's own write, and a heartbeat or two.
const ownWriteSlack = 2048

// ReadStatus reads the stream's state through db, a pool on the outbox's
// database.
func ReadStatus(ctx context.Context, db *sql.DB, n Names) (Status, error) {
	r, err := n.resolve()
	if err != nil {
		return Status{}, err
	}
	st := Status{Name: r.name}
	if st.DefaultSet, err = defaultIsSet(ctx, db, r); err != nil {
		return st, err
	}
	s, err := readStored(ctx, db, r)
	if errors.Is(err, ErrNotSetUp) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	st.Exists, st.Position, st.StoredAt = true, s.pos, s.updatedAt
	if s.eventTime.Valid {
		st.EventTime = s.eventTime.Time
	}
	if st.Server, err = serverPosition(ctx, db); err != nil {
		return st, err
	}
	files, err := binaryLogs(ctx, db)
	if err != nil {
		return st, err
	}
	st.BehindBytes, st.FilesHeld = behind(files, st.Position, st.Server)
	if st.BehindBytes > ownWriteSlack {
		st.Lag = max(time.Since(st.StoredAt), 0)
	}
	var database string
	if err := db.QueryRowContext(ctx, "SELECT "+schemaExpr(r)).Scan(&database); err != nil {
		return st, err
	}
	var holder sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", lockName(database, r.name)).Scan(&holder); err != nil {
		return st, fmt.Errorf("binlogrelay: status: %w", err)
	}
	st.Streaming, st.StreamingConnection = holder.Valid, holder.Int64
	return st, nil
}

// behind sums the bytes of files from pos to server, and reports whether
// pos's file is among them.
func behind(files []binlogFile, pos, server Position) (int64, bool) {
	var n int64
	held, counting := false, false
	for _, f := range files {
		if f.name == pos.File {
			held, counting = true, true
			n -= int64(pos.Offset)
		}
		if !counting {
			continue
		}
		if f.name == server.File {
			return n + int64(server.Offset), held
		}
		n += f.size
	}
	return max(n, 0), held
}

// TeardownOptions configures Teardown.
type TeardownOptions struct {
	// Wait bounds how long Teardown waits for the stream to reach the
	// switch back to table mode. Default 30s.
	Wait time.Duration
	// Force hands what the stream has not reached after Wait to the
	// table's retry path (Recover) instead of failing with ErrNotDrained.
	Force bool
}

// Teardown switches the table back to table mode: it drops published_at's
// log-mode default first, so that producers' rows are the table relay's
// from that moment, waits until a log relay has stored a position past
// that moment (it delivered everything written before it), then deletes
// the stream's position. A relay streaming it stops with ErrNotSetUp.
func Teardown(ctx context.Context, dsn string, n Names, opts TeardownOptions) error {
	r, err := n.resolve()
	if err != nil {
		return err
	}
	if opts.Wait <= 0 {
		opts.Wait = 30 * time.Second
	}
	db, _, err := open(dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "ALTER TABLE "+r.quoted+" ALTER COLUMN published_at SET DEFAULT NULL"); err != nil {
		return fmt.Errorf("binlogrelay: teardown: drop published_at's default: %w", err)
	}
	switched, err := serverPosition(ctx, db)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(opts.Wait)
	for {
		s, err := readStored(ctx, db, r)
		if errors.Is(err, ErrNotSetUp) {
			return nil
		}
		if err != nil {
			return err
		}
		if !before(s.pos, switched) {
			break
		}
		if time.Now().After(deadline) {
			if !opts.Force {
				return fmt.Errorf("%w: stream %s is at %s, the switch at %s; is a log relay running? (published_at's default is dropped: new events go to the table)",
					ErrNotDrained, r.name, s.pos, switched)
			}
			if _, err := requeue(ctx, db, r, s); err != nil {
				return err
			}
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM "+r.positions+" WHERE name = ?", r.name); err != nil {
		return fmt.Errorf("binlogrelay: teardown: %w", err)
	}
	return nil
}

// before reports whether a is before b in the binlog. File names end in a
// sequence number of fixed width, so they order as strings.
func before(a, b Position) bool {
	if a.File != b.File {
		return a.File < b.File
	}
	return a.Offset < b.Offset
}

// RecoverMargin is how far before the stored position's event time
// Recover reaches back: the binlog keeps commit times to the second, and a
// row's published_at is its insert, which precedes its commit.
const RecoverMargin = time.Minute

// Recover is the way back when the stream cannot resume from its stored
// position (ErrBinlogPurged, or a server whose binlog was reset): it moves
// the stored position to the server's current one, then hands every row
// the stream may not have published to the table's retry path (published_at
// back to NULL, so that the table relay publishes it): the rows handed to
// the log since RecoverMargin before the stored position's event time. The
// events come again at least once; consumers' inboxes drop the ones that
// had arrived. Rows that cleanup already deleted cannot come back: keep the
// retention longer than a stream may be down. It returns how many rows it
// handed over.
func Recover(ctx context.Context, dsn string, n Names) (int64, error) {
	r, err := n.resolve()
	if err != nil {
		return 0, err
	}
	db, _, err := open(dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	s, err := readStored(ctx, db, r)
	if err != nil {
		return 0, err
	}
	// The new position first: rows written after it are streamed, rows
	// before it are requeued (some both: duplicates, never a gap).
	p, err := serverPosition(ctx, db)
	if err != nil {
		return 0, err
	}
	if _, err := db.ExecContext(ctx, "UPDATE "+r.positions+" SET file = ?, pos = ?, updated_at = UTC_TIMESTAMP(6) WHERE name = ?",
		p.File, p.Offset, r.name); err != nil {
		return 0, fmt.Errorf("binlogrelay: recover: %w", err)
	}
	return requeue(ctx, db, r, s)
}

// requeue hands the rows handed to the log since s's event time (less
// RecoverMargin) and never through the table to the table's retry path.
func requeue(ctx context.Context, db *sql.DB, r resolved, s stored) (int64, error) {
	since := s.updatedAt
	if s.eventTime.Valid {
		since = s.eventTime.Time
	}
	res, err := db.ExecContext(ctx, "UPDATE "+r.quoted+" SET published_at = NULL, next_attempt_at = UTC_TIMESTAMP(6)"+
		" WHERE published_at >= ? AND attempt_count = 0 AND last_error IS NULL AND dead_at IS NULL", since.Add(-RecoverMargin))
	if err != nil {
		return 0, fmt.Errorf("binlogrelay: hand the events since %s to the table's retry path: %w", since.Format(time.RFC3339), err)
	}
	return res.RowsAffected()
}
