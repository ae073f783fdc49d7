package logrelay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// Defaults of the replication objects log mode uses.
const (
	DefaultSlot        = "txoutbox"
	DefaultPublication = "txoutbox"
	// TriggerName is the BEFORE INSERT trigger Setup puts on the outbox
	// table. The stores recognise an insert that returned no rows because
	// of it (they do not write back Seq and CreatedAt then).
	TriggerName = dialect.LogTrigger
)

// messagePrefix starts the prefix of log mode's messages, followed by the
// table. The content is the event's fields but its payload, as one line
// of JSON (which escapes any newline in its strings), a newline, then the
// payload as PostgreSQL prints jsonb: the relay decodes the small line and
// takes the payload as it is, valid JSON by construction.
const messagePrefix = "txoutbox/1:"

// relaySetting is the transaction setting under which the relay writes the
// events it hands to the table's retry path: the trigger lets those rows in.
const relaySetting = "txoutbox.relay"

// Sentinels of log mode.
var (
	// ErrNoSlot: the replication slot does not exist (run Setup, or
	// txoutbox log create).
	ErrNoSlot = errors.New("logrelay: replication slot does not exist")
	// ErrSlotInvalidated: the server invalidated the slot (it retained
	// more WAL than max_slot_wal_keep_size allows). Events written while
	// it was invalid may be lost from the log: recreate the slot and
	// reconcile with the producers.
	ErrSlotInvalidated = errors.New("logrelay: replication slot was invalidated by the server")
	// ErrNotDrained: Teardown found events in the slot that no relay has
	// confirmed yet.
	ErrNotDrained = errors.New("logrelay: slot holds events no relay has confirmed")
	// ErrWALLevel: the server does not run with wal_level = logical.
	ErrWALLevel = errors.New("logrelay: the server's wal_level is not logical")
	// ErrOutdatedTrigger: the trigger function predates scheduled events
	// (core.Event.NotBefore), the relay's role could not update it, and
	// with it a scheduled event would be published at once. The relay
	// stops rather than publish early.
	ErrOutdatedTrigger = errors.New("logrelay: log mode's trigger function predates scheduled events")
	// ErrPooler: ConnString reaches PostgreSQL through a connection pooler
	// (PgBouncer), which does not pass replication connections. Log
	// mode's relay needs a DSN that reaches the server directly;
	// producers may keep theirs through the pooler.
	ErrPooler = errors.New("logrelay: the replication connection must reach PostgreSQL directly, not through a connection pooler (PgBouncer); give the log relay a direct DSN, producers may keep the pooler")
)

// Names are the database objects of log mode for one outbox table.
type Names struct {
	// Table is the outbox table. Default dialect.DefaultTable.
	Table string
	// Slot is the logical replication slot. Default DefaultSlot.
	Slot string
	// Publication is the (empty) publication pgoutput is started with; the
	// events travel as logical decoding messages, not as table changes.
	// Default DefaultPublication.
	Publication string
}

var slotRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// resolved is Names validated, with defaults.
type resolved struct {
	table       dialect.Identifier
	slot, pub   string
	prefix      string // of the logical messages
	fn, trigger string // quoted, qualified
	quotedTable string
	positions   string // PositionsTable, quoted, qualified
}

func (n Names) resolve() (resolved, error) {
	if n.Table == "" {
		n.Table = dialect.DefaultTable
	}
	if n.Slot == "" {
		n.Slot = DefaultSlot
	}
	if n.Publication == "" {
		n.Publication = DefaultPublication
	}
	id, err := dialect.ValidateIdentifier(n.Table)
	if err != nil {
		return resolved{}, fmt.Errorf("%w: logrelay: table: %w", core.ErrInvalidOptions, err)
	}
	if !slotRE.MatchString(n.Slot) {
		return resolved{}, fmt.Errorf("%w: logrelay: slot %q: want [a-z0-9_]{1,63}", core.ErrInvalidOptions, n.Slot)
	}
	if !slotRE.MatchString(n.Publication) {
		return resolved{}, fmt.Errorf("%w: logrelay: publication %q: want [a-z0-9_]{1,63}", core.ErrInvalidOptions, n.Publication)
	}
	r := resolved{table: id, slot: n.Slot, pub: n.Publication, prefix: messagePrefix + id.String()}
	r.quotedTable = dialect.Postgres.Quote(id)
	fnName := "txoutbox_log_" + id.Name
	if len(fnName) > 63 {
		fnName = fnName[:63]
	}
	r.fn = dialect.Postgres.Quote(dialect.Identifier{Schema: id.Schema, Name: fnName})
	r.trigger = `"` + TriggerName + `"`
	r.positions = dialect.Postgres.Quote(dialect.Identifier{Schema: id.Schema, Name: PositionsTable})
	return r, nil
}

// PositionsTable is the table, in the outbox's schema, where the relays
// record the position they confirmed, once a second: PostgreSQL keeps a
// slot's confirmed position on disk only when the slot's restart position
// moves or at a checkpoint, so after a crash the slot reverts to an older
// one, and the next relay starts from whichever of the two is later.
const PositionsTable = "txoutbox_log_positions"

// positionsDDL creates PositionsTable.
func positionsDDL(r resolved) string {
	return `CREATE TABLE IF NOT EXISTS ` + r.positions + ` (slot text PRIMARY KEY, lsn pg_lsn NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())`
}

// Setup prepares a PostgreSQL database for log mode, idempotently, in this
// order: the publication, the replication slot, the positions table
// (PositionsTable), then the trigger that turns
// every insert into the outbox table into a transactional logical decoding
// message (pg_logical_emit_message) and keeps the row out of the table.
// The slot comes before the trigger so that no event is ever written while
// no slot retains it. The outbox table must exist (dialect.Migrate).
//
// The role needs the REPLICATION attribute (or superuser), CREATE on the
// database (for the publication) and ownership of the table.
func Setup(ctx context.Context, connString string, n Names) error {
	r, err := n.resolve()
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return fmt.Errorf("logrelay: setup: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var level string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return fmt.Errorf("logrelay: setup: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("%w (it is %q): set wal_level = logical and restart the server", ErrWALLevel, level)
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", r.quotedTable).Scan(&exists); err != nil {
		return fmt.Errorf("logrelay: setup: %w", err)
	}
	if !exists {
		return fmt.Errorf("logrelay: setup: table %s: %w", r.table, core.ErrNotMigrated)
	}
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", r.pub).Scan(&exists); err != nil {
		return fmt.Errorf("logrelay: setup: %w", err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, `CREATE PUBLICATION "`+r.pub+`"`); err != nil {
			return fmt.Errorf("logrelay: create publication %s: %w", r.pub, err)
		}
	}
	var plugin, database string
	err = conn.QueryRow(ctx, "SELECT coalesce(plugin, ''), coalesce(database, '') FROM pg_replication_slots WHERE slot_name = $1", r.slot).Scan(&plugin, &database)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", r.slot); err != nil {
			return fmt.Errorf("logrelay: create slot %s: %w", r.slot, err)
		}
	case err != nil:
		return fmt.Errorf("logrelay: setup: %w", err)
	default:
		var current string
		if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&current); err != nil {
			return fmt.Errorf("logrelay: setup: %w", err)
		}
		if plugin != "pgoutput" || database != current {
			return fmt.Errorf("%w: logrelay: slot %s exists with plugin %q on database %q; log mode needs a pgoutput slot on %q",
				core.ErrInvalidOptions, r.slot, plugin, database, current)
		}
	}
	if _, err := conn.Exec(ctx, positionsDDL(r)); err != nil {
		return fmt.Errorf("logrelay: setup: create %s: %w", PositionsTable, err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("logrelay: setup: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it is a no-op
	for _, stmt := range []string{
		triggerFunction(r),
		"DROP TRIGGER IF EXISTS " + r.trigger + " ON " + r.quotedTable,
		"CREATE TRIGGER " + r.trigger + " BEFORE INSERT ON " + r.quotedTable + " FOR EACH ROW EXECUTE FUNCTION " + r.fn + "()",
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("logrelay: install trigger on %s: %w", r.table, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("logrelay: install trigger on %s: %w", r.table, err)
	}
	return nil
}

// TeardownOptions configures Teardown.
type TeardownOptions struct {
	// Wait is how long Teardown waits for the relays to confirm every event
	// the slot holds before it gives up with ErrNotDrained. Default 30s.
	Wait time.Duration
	// Force drops the slot even when it holds unconfirmed events: they
	// are lost. For a slot whose events are known to be delivered or
	// unwanted.
	Force bool
}

// Teardown switches the table back to table mode and removes log mode's
// objects: it drops the trigger first, so that producers' events land in
// the table again from that moment, then waits until the slot's confirmed
// position passes that moment (the log relays have delivered everything
// written before it), then drops the slot, the publication and the
// trigger's function. A relay streaming the slot is disconnected; it stops
// with ErrNoSlot.
func Teardown(ctx context.Context, connString string, n Names, opts TeardownOptions) error {
	r, err := n.resolve()
	if err != nil {
		return err
	}
	if opts.Wait == 0 {
		opts.Wait = 30 * time.Second
	}
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return fmt.Errorf("logrelay: teardown: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP TRIGGER IF EXISTS "+r.trigger+" ON "+r.quotedTable); err != nil {
		return fmt.Errorf("logrelay: drop trigger on %s: %w", r.table, err)
	}
	var switched string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&switched); err != nil {
		return fmt.Errorf("logrelay: teardown: %w", err)
	}
	deadline := time.Now().Add(opts.Wait)
	for {
		var behind *int64
		err := conn.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $2",
			switched, r.slot).Scan(&behind)
		if errors.Is(err, pgx.ErrNoRows) {
			break // already gone
		}
		if err != nil {
			return fmt.Errorf("logrelay: teardown: %w", err)
		}
		if behind == nil || *behind <= 0 || opts.Force {
			if err := dropSlot(ctx, conn, r.slot); err != nil {
				return err
			}
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: slot %s is %d bytes of WAL behind the switch back to table mode at %s; is a log relay running? (the trigger is dropped: new events go to the table)",
				ErrNotDrained, r.slot, *behind, switched)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	for _, stmt := range []string{`DROP PUBLICATION IF EXISTS "` + r.pub + `"`, "DROP FUNCTION IF EXISTS " + r.fn + "()"} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("logrelay: teardown: %w", err)
		}
	}
	// The slot's recorded position goes with it (a table of a setup
	// before the positions table has none).
	if _, err := conn.Exec(ctx, "DELETE FROM "+r.positions+" WHERE slot = $1", r.slot); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
			return fmt.Errorf("logrelay: teardown: %w", err)
		}
	}
	return nil
}

// dropSlot drops the slot, disconnecting the relay that streams it.
func dropSlot(ctx context.Context, conn *pgx.Conn, slot string) error {
	for i := 0; ; i++ {
		_, err := conn.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", slot)
		if err == nil {
			_, err = conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot)
		}
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55006" || i == 50 {
			if err != nil {
				return fmt.Errorf("logrelay: drop slot %s: %w", slot, err)
			}
			return nil
		}
		// The terminated walsender has not released the slot yet.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// SlotStatus is what the server reports of log mode's slot.
type SlotStatus struct {
	Slot string
	// Exists is false when there is no such slot; the other fields are
	// then zero.
	Exists bool
	// Active: a relay streams the slot now, from the server process
	// ActivePID.
	Active    bool
	ActivePID int
	// RetainedBytes is the WAL the slot keeps the server from removing
	// (current position - restart_lsn): the disk an abandoned slot fills.
	RetainedBytes int64
	// UnconfirmedBytes is the WAL written since the relays' confirmed
	// position: the events in it are pending.
	UnconfirmedBytes int64
	// ConfirmedAge is how long ago the WAL now confirmed was written, as
	// the streaming walsender measures it (pg_stat_replication.flush_lag);
	// 0 when caught up, and unknown (-1) when no relay streams.
	ConfirmedAge time.Duration
	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved (about to be invalidated) or lost.
	WALStatus string
	// Invalidated: the server gave the slot up (wal_status lost). Events
	// may be missing from it; see ErrSlotInvalidated.
	Invalidated bool
	// SafeWALBytes is how much more WAL the slot may retain before
	// max_slot_wal_keep_size invalidates it; -1 when unlimited.
	SafeWALBytes int64
	// TriggerInstalled: producers' inserts into the table go to the log.
	TriggerInstalled bool
}

// Status reads the slot's state from the server.
func Status(ctx context.Context, connString string, n Names) (SlotStatus, error) {
	r, err := n.resolve()
	if err != nil {
		return SlotStatus{}, err
	}
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return SlotStatus{}, fmt.Errorf("logrelay: status: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return readStatus(ctx, conn, r)
}

// StatusDB is Status through db, a pool of the caller's on the same
// database (database/sql, with pgx's stdlib driver or another PostgreSQL
// driver), so that a page or probe that asks often opens no connection of
// its own.
func StatusDB(ctx context.Context, db *sql.DB, n Names) (SlotStatus, error) {
	r, err := n.resolve()
	if err != nil {
		return SlotStatus{}, err
	}
	if db == nil {
		return SlotStatus{}, fmt.Errorf("%w: logrelay.StatusDB needs a *sql.DB", core.ErrInvalidOptions)
	}
	return readStatus(ctx, sqlQuerier{db}, r)
}

// sqlQuerier is a *sql.DB as a querier: *sql.Row has pgx.Row's Scan.
type sqlQuerier struct{ db *sql.DB }

func (q sqlQuerier) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return q.db.QueryRowContext(ctx, query, args...)
}

// querier is what readStatus needs of a connection or a pool.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const statusSQL = `SELECT s.active, coalesce(s.active_pid, 0),
	coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::bigint,
	coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::bigint,
	coalesce(s.wal_status, ''), coalesce(s.safe_wal_size, -1)::bigint,
	coalesce((SELECT extract(epoch FROM coalesce(r.flush_lag, interval '0'))::float8 FROM pg_stat_replication r WHERE r.pid = s.active_pid), -1),
	EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = to_regclass($2) AND t.tgname = $3)
FROM pg_replication_slots s WHERE s.slot_name = $1`

func readStatus(ctx context.Context, q querier, r resolved) (SlotStatus, error) {
	st := SlotStatus{Slot: r.slot}
	var age float64
	err := q.QueryRow(ctx, statusSQL, r.slot, r.quotedTable, TriggerName).Scan(&st.Active, &st.ActivePID,
		&st.RetainedBytes, &st.UnconfirmedBytes, &st.WALStatus, &st.SafeWALBytes, &age, &st.TriggerInstalled)
	if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("logrelay: status of slot %s: %w", r.slot, err)
	}
	st.Exists = true
	st.Invalidated = st.WALStatus == "lost"
	st.ConfirmedAge = -1
	if age >= 0 {
		st.ConfirmedAge = time.Duration(age * float64(time.Second))
	}
	return st, nil
}

// triggerFunction is the statement that creates (or updates) the trigger's
// function. The row is never stored: the message carries it, and the
// relay's own writes (the retry path, under relaySetting) pass through. The
// message carries next_attempt_at, a scheduled event's NotBefore, so that
// the stream hands such an event to the table instead of publishing it
// early.
func triggerFunction(r resolved) string {
	return `CREATE OR REPLACE FUNCTION ` + r.fn + `() RETURNS trigger LANGUAGE plpgsql AS $txoutbox$
BEGIN
	IF current_setting('` + relaySetting + `', true) = 'on' THEN
		RETURN NEW;
	END IF;
	PERFORM pg_logical_emit_message(true, '` + r.prefix + `', json_build_object(
		'id', NEW.id, 'event_id', NEW.event_id, 'aggregate_type', NEW.aggregate_type,
		'aggregate_id', NEW.aggregate_id, 'event_type', NEW.event_type,
		'headers', NEW.headers, 'created_at', NEW.created_at,
		'` + scheduleKey + `', NEW.next_attempt_at)::text || E'\n' || NEW.payload::text);
	RETURN NULL;
END
$txoutbox$`
}

// scheduleKey is the message's key of next_attempt_at; a trigger function
// without it predates scheduled events (see updateTrigger).
const scheduleKey = "next_attempt_at"

// updateTrigger brings a trigger function that Setup installed before
// scheduled events existed up to date: with it, a scheduled event would be
// published at once. A function that does not exist is left to the
// stream's other checks.
func updateTrigger(ctx context.Context, pool *pgxpool.Pool, r resolved) error {
	var current bool
	err := pool.QueryRow(ctx, "SELECT COALESCE((SELECT position($1 in prosrc) > 0 FROM pg_proc WHERE oid = to_regprocedure($2)), true)",
		"'"+scheduleKey+"'", r.fn+"()").Scan(&current)
	if err != nil || current {
		return err
	}
	if _, err := pool.Exec(ctx, triggerFunction(r)); err != nil {
		return fmt.Errorf("%w: %s could not be updated (run txoutbox log create, or logrelay.Setup, again as the table's owner): %w", ErrOutdatedTrigger, r.fn, err)
	}
	return nil
}
