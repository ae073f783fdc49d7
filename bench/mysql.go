package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
	"github.com/google/uuid"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/mysqldsn"
)

// Scenario m: MySQL/MariaDB. The table names are those of the PostgreSQL
// scenarios, in a database of its own on the MySQL server.
const mysqlDrainTable = "drain_events"

// mysqlBench is scenario m's database: created for the run, dropped after.
type mysqlBench struct {
	admin   *sql.DB
	db      *sql.DB
	name    string
	version string
}

// openMySQL creates the scenario's database on the server of c.MySQLDSN and
// opens it with interpolateParams, as docs/mysql.md recommends (the driver
// otherwise prepares every statement, one round trip more, for the relay
// and the raw loop alike).
func (b *bench) openMySQL(ctx context.Context) (*mysqlBench, error) {
	cfg, err := mysqldsn.Config(b.c.MySQLDSN)
	if err != nil {
		return nil, err
	}
	cfg.DBName = ""
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	m := &mysqlBench{admin: admin, name: b.name}
	if err := admin.QueryRowContext(ctx, "SELECT VERSION()").Scan(&m.version); err != nil {
		admin.Close()
		return nil, fmt.Errorf("connect to MySQL: %w", err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+m.name+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		admin.Close()
		return nil, fmt.Errorf("create MySQL database (the DSN's user must be allowed to): %w", err)
	}
	cfg.DBName = m.name
	cfg.InterpolateParams = true
	if m.db, err = sql.Open("mysql", cfg.FormatDSN()); err != nil {
		m.close(b)
		return nil, err
	}
	m.db.SetMaxOpenConns(32)
	m.db.SetMaxIdleConns(32)
	return m, nil
}

func (m *mysqlBench) close(b *bench) {
	if m.db != nil {
		m.db.Close()
	}
	if !b.c.Keep {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := m.admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+m.name); err != nil {
			b.log.Warn("drop MySQL bench database", "name", m.name, "error", err)
		}
	}
	m.admin.Close()
}

// mysqlScenario runs scenario m: the relay's drain on MySQL against the
// same claim and mark statements written by hand, taking turns batch by
// batch, and producer transactions per second with and without the outbox
// row, taking turns by the second.
func (b *bench) mysqlScenario(ctx context.Context) ([]row, error) {
	m, err := b.openMySQL(ctx)
	if err != nil {
		return nil, err
	}
	defer m.close(b)
	b.mysqlServer = m.version
	mig := dialect.MigrateOptions{SkipInbox: true, Logger: b.quiet}
	for _, table := range []string{mysqlDrainTable, producerTable + "_" + prodPlain, producerTable + "_" + prodEnqueue, producerTable + "_" + prodEnqueueSkip, producerTable + "_" + prodOutbox, producerTable + "_" + prodHand} {
		mig.Table = table
		if err := dialect.Migrate(ctx, m.db, dialect.MySQL, mig); err != nil {
			return nil, err
		}
	}

	// Drain.
	store, err := sqlxoutbox.NewDB(m.db, sqlxoutbox.Options{Dialect: dialect.MySQL, Table: mysqlDrainTable, Logger: b.quiet})
	if err != nil {
		return nil, err
	}
	relay, err := b.relayBatch(ctx, store)
	if err != nil {
		return nil, err
	}
	deleting, err := sqlxoutbox.NewDB(m.db, sqlxoutbox.Options{Dialect: dialect.MySQL, Table: mysqlDrainTable, Logger: b.quiet, DeleteOnPublish: true})
	if err != nil {
		return nil, err
	}
	relayDelete, err := b.relayBatch(ctx, deleting)
	if err != nil {
		return nil, err
	}
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	sides := []drainSide{
		{name: "raw", batch: func() (int, error) { return mysqlRawBatch(ctx, conn, mysqlRawMark) }},
		{name: "relay", batch: relay},
		{name: "raw_delete", batch: func() (int, error) { return mysqlRawBatch(ctx, conn, mysqlRawDelete) }},
		{name: "relay_delete", batch: relayDelete},
	}
	fill := func(ctx context.Context, n int) error { return mysqlFill(ctx, m.db, store, n) }
	if err := b.takeTurns(ctx, "mysql drain", fill, sides); err != nil {
		return nil, err
	}

	// Producers.
	if _, err := m.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, customer_id VARCHAR(64) NOT NULL, amount_cents INT NOT NULL,
		payload LONGTEXT NOT NULL, created_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))) ENGINE = InnoDB`); err != nil {
		return nil, err
	}
	variants := []string{prodPlain, prodEnqueue, prodEnqueueSkip, prodOutbox, prodHand}
	boxes := map[string]*sqlxoutbox.Outbox{}
	for _, v := range variants {
		opts := sqlxoutbox.Options{Dialect: dialect.MySQL, Table: producerTable + "_" + v, Logger: b.quiet, SkipReadBack: v == prodEnqueueSkip}
		if boxes[v], err = sqlxoutbox.NewDB(m.db, opts); err != nil {
			return nil, err
		}
	}
	rate, _, err := b.rotate(ctx, "mysql producers", variants, func(v string, d time.Duration) (int64, time.Duration, error) {
		return b.produce(ctx, d, func(ctx context.Context, i int) error { return mysqlProduce(ctx, m.db, boxes[v], v, i) })
	})
	if err != nil {
		return nil, err
	}
	bloat, err := b.mysqlBloat(ctx, m.db)
	if err != nil {
		return nil, err
	}
	logRows, err := b.binlogRows(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("log mode: %w", err)
	}
	bloat = append(bloat, logRows...)
	raw, rel, del, relDel := sides[0].rate(), sides[1].rate(), sides[2].rate(), sides[3].rate()
	clients := fmt.Sprintf("%d clients", b.c.Producers)
	return append([]row{
		{name: "m  MariaDB relay drain vs raw SQL claim+mark, same statements (events/s, batch 100, 1 worker)", value: rel, baseline: raw,
			unit: "/s", target: "≥ 90 %", pass: rel >= 0.9*raw, verdict: true},
		{name: "m''' MariaDB delete on publish, by hand: lock, then DELETE vs lock, then UPDATE (raw SQL claim+mark)", value: del, baseline: raw,
			unit: "/s", target: "—"},
		{name: "m''' MariaDB relay drain with DeleteOnPublish vs the relay that marks (its default)", value: relDel, baseline: rel,
			unit: "/s", target: "—"},
		{name: "m' MariaDB producer tx/s with the outbox row (Enqueue: insert and read-back) vs without (" + clients + ")", value: rate[prodEnqueue], baseline: rate[prodPlain],
			unit: " tx/s", target: "—"},
		{name: "m' MariaDB producer tx/s with the outbox row (Enqueue with SkipReadBack: the insert alone) vs without", value: rate[prodEnqueueSkip], baseline: rate[prodPlain],
			unit: " tx/s", target: "—"},
		{name: "m' MariaDB producer tx/s with the outbox row (ExecWithEvents: the events' insert, then the statement, no read-back) vs without", value: rate[prodOutbox], baseline: rate[prodPlain],
			unit: " tx/s", target: "—"},
		{name: "m' MariaDB producer tx/s, a hand-written INSERT of the same event row vs without (the floor of any outbox row)", value: rate[prodHand], baseline: rate[prodPlain],
			unit: " tx/s", target: "—"},
		{name: "m  MariaDB producer tx/s, Enqueue with SkipReadBack vs the hand-written INSERT of the same row", value: rate[prodEnqueueSkip], baseline: rate[prodHand],
			unit: " tx/s", target: "≥ 95 %", pass: rate[prodEnqueueSkip] >= 0.95*rate[prodHand], verdict: true},
	}, bloat...), nil
}

// mysqlBloat is scenario e on MySQL: claim latency on a table holding
// Pending due events and MySQLRetained published ones, against one holding
// only the due events. It measures the claim index chosen for InnoDB,
// which has no partial index: (published_at, dead_at, next_attempt_at, id)
// keeps the due rows in one contiguous range, away from the published.
func (b *bench) mysqlBloat(ctx context.Context, db *sql.DB) ([]row, error) {
	stores := map[string]*sqlxoutbox.Outbox{}
	for _, table := range []string{"bloat_empty", "bloat_retained"} {
		if err := dialect.Migrate(ctx, db, dialect.MySQL, dialect.MigrateOptions{Table: table, SkipInbox: true, Logger: b.quiet}); err != nil {
			return nil, err
		}
		var err error
		if stores[table], err = sqlxoutbox.NewDB(db, sqlxoutbox.Options{Dialect: dialect.MySQL, Table: table, Logger: b.quiet}); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	// Retained rows: 1000 published ones, doubled until there are enough
	// (no generate_series on MySQL).
	if _, err := db.ExecContext(ctx, "INSERT INTO bloat_retained (event_id, aggregate_type, aggregate_id, event_type, payload, created_at, published_at, attempt_count)"+
		" SELECT UUID(), 'order', CONCAT('o-', p), 'order.created', '{\"order_id\": \"o-1\", \"status\": \"created\"}',"+
		" UTC_TIMESTAMP(6) - INTERVAL 7 DAY, UTC_TIMESTAMP(6) - INTERVAL 7 DAY, 1"+
		" FROM JSON_TABLE(?, '$[*]' COLUMNS (p INT PATH '$')) AS j", jsonInts(1000)); err != nil {
		return nil, err
	}
	for n := 1000; n < b.c.MySQLRetained; n *= 2 {
		if _, err := db.ExecContext(ctx, "INSERT INTO bloat_retained (event_id, aggregate_type, aggregate_id, event_type, payload, created_at, published_at, attempt_count)"+
			" SELECT UUID(), aggregate_type, aggregate_id, event_type, payload, created_at, published_at, attempt_count FROM bloat_retained"); err != nil {
			return nil, fmt.Errorf("write retained rows: %w", err)
		}
	}
	var retained int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM bloat_retained").Scan(&retained); err != nil {
		return nil, err
	}
	for table, store := range stores {
		if err := mysqlInsertDue(ctx, db, store, b.c.Pending); err != nil {
			return nil, err
		}
		if _, err := db.ExecContext(ctx, "ANALYZE TABLE "+table); err != nil {
			return nil, err
		}
	}
	b.log.Info("mysql bloat: tables ready", "retained", retained, "took", time.Since(start))
	de, df, err := b.claimLatencies(ctx, stores["bloat_empty"], stores["bloat_retained"])
	if err != nil {
		return nil, err
	}
	p50e, p50f := ms(percentile(de, 0.5)), ms(percentile(df, 0.5))
	return []row{
		{name: fmt.Sprintf("m  MariaDB claim latency p50, %s published rows retained vs empty table (%d pending, batch %d)", count(retained), b.c.Pending, b.c.ClaimBatchSize),
			value: p50f, baseline: p50e, unit: "ms", ratioX: true, target: "≤ 2×", pass: p50f <= 2*p50e, verdict: true},
		{name: "m  MariaDB claim latency p99, same tables", value: ms(percentile(df, 0.99)), baseline: ms(percentile(de, 0.99)), unit: "ms", ratioX: true, target: "—"},
	}, nil
}

// mysqlInsertDue writes n due events through store's INSERT, 1000 per
// statement.
func mysqlInsertDue(ctx context.Context, db *sql.DB, store *sqlxoutbox.Outbox, n int) error {
	q := store.Queries()
	evs := make([]core.Event, 0, dialect.MaxInsertRows)
	for i := 0; i < n; i += dialect.MaxInsertRows {
		evs = evs[:0]
		for j := i; j < min(i+dialect.MaxInsertRows, n); j++ {
			ev := core.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", j%1000), EventType: "order.created", Payload: []byte(orderPayload(j))}
			if err := ev.Prepare(); err != nil {
				return err
			}
			evs = append(evs, ev)
		}
		query, args, err := q.Insert(evs)
		if err != nil {
			return err
		}
		if _, err := db.ExecContext(ctx, query, args...); err != nil {
			return err
		}
	}
	return nil
}

// jsonInts is the JSON array [0, ..., n-1].
func jsonInts(n int) string {
	b, _ := json.Marshal(func() []int {
		xs := make([]int, n)
		for i := range xs {
			xs[i] = i
		}
		return xs
	}())
	return string(b)
}

// mysqlFill empties the drain table and writes n due events.
func mysqlFill(ctx context.Context, db *sql.DB, store *sqlxoutbox.Outbox, n int) error {
	if _, err := db.ExecContext(ctx, "TRUNCATE TABLE "+mysqlDrainTable); err != nil {
		return err
	}
	if err := mysqlInsertDue(ctx, db, store, n); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, "ANALYZE TABLE "+mysqlDrainTable)
	return err
}

// mysqlRawClaim, mysqlRawMark and mysqlRawDelete are the store's claim,
// mark and delete on publish on MySQL written out by hand: the same
// statements, scanned into locals. The mark spells its Seqs out in an IN
// list on the primary key; the delete joins them through JSON_TABLE.
const mysqlRawClaim = "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, published_at," +
	" attempt_count, last_error, next_attempt_at, dead_at FROM " + mysqlDrainTable +
	" WHERE published_at IS NULL AND dead_at IS NULL AND next_attempt_at <= UTC_TIMESTAMP(6)" +
	" ORDER BY next_attempt_at, id LIMIT 100 FOR UPDATE SKIP LOCKED"

func mysqlRawMark(ids []int64) (string, []any) {
	list := make([]string, len(ids))
	for i, id := range ids {
		list[i] = strconv.FormatInt(id, 10)
	}
	return "UPDATE " + mysqlDrainTable + " AS o FORCE INDEX (PRIMARY) SET published_at = UTC_TIMESTAMP(6), attempt_count = attempt_count + 1, last_error = NULL" +
		" WHERE o.id IN (" + strings.Join(list, ",") + ")", nil
}

func mysqlRawDelete(ids []int64) (string, []any) {
	js, _ := json.Marshal(ids) // []int64 always encodes
	return "DELETE o FROM JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$')) AS j STRAIGHT_JOIN " + mysqlDrainTable +
		" AS o FORCE INDEX (PRIMARY) ON o.id = j.seq", []any{string(js)}
}

// mysqlRawBatch claims one batch on conn, runs mark (mysqlRawMark or
// mysqlRawDelete) on it and returns its size.
func mysqlRawBatch(ctx context.Context, conn *sql.Conn, mark func([]int64) (string, []any)) (int, error) {
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	rows, err := tx.QueryContext(ctx, mysqlRawClaim)
	if err != nil {
		return 0, err
	}
	var (
		ids                             []int64
		id                              int64
		attempts                        int
		eid, at, aid, et                string
		payload, headers, created, next []byte
		published, lastErr, dead        sql.RawBytes
	)
	for rows.Next() {
		if err := rows.Scan(&id, &eid, &at, &aid, &et, &payload, &headers, &created, &published, &attempts, &lastErr, &next, &dead); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	if err := rows.Close(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	query, args := mark(ids)
	if _, err := tx.ExecContext(ctx, query, args...); err != nil {
		return 0, err
	}
	return len(ids), tx.Commit()
}

// mysqlProduce is one producer transaction of scenario m.
func mysqlProduce(ctx context.Context, db *sql.DB, box *sqlxoutbox.Outbox, variant string, i int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	payload := orderPayload(i)
	const insert = "INSERT INTO orders (customer_id, amount_cents, payload) VALUES (?, ?, ?)"
	args := orderArgs(i, payload)
	ev := core.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i), EventType: "order.created", Payload: []byte(payload)}
	switch variant {
	case prodPlain:
		_, err = tx.ExecContext(ctx, insert, args...)
	case prodEnqueue, prodEnqueueSkip:
		if _, err = tx.ExecContext(ctx, insert, args...); err == nil {
			err = box.Enqueue(ctx, tx, ev)
		}
	case prodHand:
		if _, err = tx.ExecContext(ctx, insert, args...); err == nil {
			_, err = tx.ExecContext(ctx, "INSERT INTO "+producerTable+"_"+prodHand+" (event_id, aggregate_type, aggregate_id, event_type, payload) VALUES (?, ?, ?, ?, ?)",
				uuid.Must(uuid.NewV7()).String(), ev.AggregateType, ev.AggregateID, ev.EventType, payload)
		}
	default:
		_, err = box.ExecWithEvents(ctx, tx, insert, args, ev)
	}
	if err != nil {
		return err
	}
	return tx.Commit()
}
