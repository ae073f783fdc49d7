package dialect

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// ComponentOrdered is the schema component of ordered mode: on PostgreSQL
// two partial indexes the ordered claim needs and the lease and relay
// tables of ordered.Leaser; on SQLite the indexes only. Migrate applies it
// with the outbox unless MigrateOptions.SkipOrdered; it is versioned on its
// own in the migrations table.
const ComponentOrdered = "ordered"

// Default names of the tables of ordered mode, created in the outbox table's
// schema. One pair serves every outbox table of the schema: rows are keyed
// by the outbox table's name (the relay group).
const (
	DefaultLeaseTable = "txoutbox_leases"
	DefaultRelayTable = "txoutbox_relays"
)

// partitionExpr is the SQL of an event row's partition, with two bind
// parameters for the partition count. PostgreSQL's hashtext is stable for a
// given server major version, and all relays ask the same server, so they
// agree; the + 2^31 makes it non-negative without abs(), which overflows on
// the smallest int4. Events without an aggregate are unordered and spread
// by Seq.
const partitionExpr = "(CASE WHEN o.aggregate_id = '' THEN mod(o.id, CAST(? AS bigint))" +
	" ELSE mod(CAST(hashtext(o.aggregate_id) AS bigint) + 2147483648, CAST(? AS bigint)) END)"

// mysqlPartitionExpr is partitionExpr on MySQL: CRC32 of the aggregate ID
// (the bytes of its utf8mb4 text), which every server computes alike.
const mysqlPartitionExpr = "(CASE WHEN o.aggregate_id = '' THEN MOD(o.id, ?) ELSE MOD(CRC32(o.aggregate_id), ?) END)"

// DefaultPartitionLockTable is, on MySQL, the table whose rows stand for
// the partitions of each outbox table (relay_group): an ordered claim locks
// the rows of the partitions it serves, FOR UPDATE SKIP LOCKED, for as long
// as its transaction lasts, as PostgreSQL's pg_try_advisory_xact_lock does.
// Row locks, unlike GET_LOCK's session locks, end with the transaction
// however it ends. The lease table is not used for this: the leaser
// renews its rows while claims run.
const DefaultPartitionLockTable = "txoutbox_partition_locks"

// PartitionLockKey is the first key of the transaction-level advisory locks
// (pg_try_advisory_xact_lock(key, partition)) that keep two claims from
// serving one partition of this table at once: an FNV-1a hash of the table
// name. Applications using two-key advisory locks should avoid it.
func (q *Queries) PartitionLockKey() int32 {
	h := fnv.New32a()
	h.Write([]byte("txoutbox/ordered:" + q.id.String()))
	return int32(h.Sum32())
}

// LockPartitions returns, on PostgreSQL, the statement to run first in an
// ordered claim's transaction: it tries the advisory lock of every given
// partition and returns the partitions it got (one column, int), which the
// claim then serves. The locks last until the transaction ends, so no other
// claim serves those partitions while the batch is published, whoever holds
// their leases. On SQLite it returns "": the lease on the rows does that.
//
// It also turns JIT compilation off for the rest of the transaction: the
// planner cannot estimate how soon the claim's LIMIT is reached, costs it
// above jit_above_cost, and compiling would take ten times longer than the
// claim itself (30 ms against 2 ms on a 100k backlog).
//
// On MySQL it locks the partitions' rows of the partition lock table
// (DefaultPartitionLockTable), skipping those another claim holds; create
// the rows first with CreatePartitionLocks.
func (q *Queries) LockPartitions(partitions []int) (string, []any) {
	if q.d.kind == kindMySQL {
		return "SELECT `partition` FROM " + q.partitionLocks() + " WHERE relay_group = ? AND FIND_IN_SET(`partition`, ?) > 0" +
			" ORDER BY `partition` FOR UPDATE SKIP LOCKED", []any{q.id.String(), intList(partitions)}
	}
	if q.d.kind != kindPostgres {
		return "", nil
	}
	return q.d.rebind("SELECT p FROM unnest(CAST(CAST(? AS text) AS int[])) AS p" +
		" CROSS JOIN (SELECT set_config('jit', 'off', true)) AS no_jit" +
		" WHERE pg_try_advisory_xact_lock(?, p) ORDER BY p"), []any{intArray(partitions), q.PartitionLockKey()}
}

// CreatePartitionLocks returns, on MySQL, the INSERT of the rows of
// partitions 0..n-1 of the partition lock table that do not exist yet
// ("" elsewhere). Run it before the first LockPartitions with n partitions.
func (q *Queries) CreatePartitionLocks(n int) (string, []any) {
	if q.d.kind != kindMySQL {
		return "", nil
	}
	return "INSERT IGNORE INTO " + q.partitionLocks() + " (relay_group, `partition`)" +
		" SELECT ?, p FROM JSON_TABLE(?, '$[*]' COLUMNS (p INT PATH '$')) AS j", []any{q.id.String(), jsonRange(n)}
}

// partitionLocks is the quoted partition lock table of q's schema.
func (q *Queries) partitionLocks() string {
	if q.id.Schema != "" {
		return q.d.quote(q.id.Schema) + "." + q.d.quote(DefaultPartitionLockTable)
	}
	return q.d.quote(DefaultPartitionLockTable)
}

// ClaimOrdered returns the statement of an ordered claim (see
// core.OrderedClaim) of up to limit events, in Seq order.
//
// On PostgreSQL run it in the claim's transaction after LockPartitions, with
// the partitions that returned; it locks the rows FOR UPDATE SKIP LOCKED
// like Claim. An event is held back by an earlier unpublished event of its
// aggregate that is in backoff or, under core.DeadLetterBlock, dead. Such an
// event has failed at least once (new, re-queued and replayed events are due
// at once, and a scheduled one, never attempted, holds nothing back), which
// lets the check use a small partial index of events with attempt_count > 0
// (see the ordered migration).
//
// On MySQL it selects, without locking, the ids of the events the claim
// takes; LockOrdered then locks them.
//
// On SQLite, which runs one writer and ignores partitions, it is one UPDATE
// stamping a lease of the given length, like Claim; an event is also held
// back by an earlier event under another claim's lease, which keeps several
// relays ordered. Its rows come back unordered: sort them by Seq.
func (q *Queries) ClaimOrdered(o core.OrderedClaim, limit int, lease time.Duration) (string, []any) {
	now := q.d.now()
	due := "o.published_at IS NULL AND o.dead_at IS NULL AND o.next_attempt_at <= " + now
	var blocker string
	switch q.d.kind {
	case kindPostgres, kindMySQL:
		blocker = "e.attempt_count > 0 AND "
		if o.DeadLetter == core.DeadLetterSkip {
			blocker += "e.dead_at IS NULL AND e.next_attempt_at > " + now
		} else {
			blocker += "(e.dead_at IS NOT NULL OR e.next_attempt_at > " + now + ")"
		}
	case kindSQLite:
		pending := "((e.attempt_count > 0 AND e.next_attempt_at > " + now + ") OR e.claimed_until > " + now + ")"
		if o.DeadLetter == core.DeadLetterSkip {
			blocker = "e.dead_at IS NULL AND " + pending
		} else {
			blocker = "(e.dead_at IS NOT NULL OR " + pending + ")"
		}
	}
	notBlocked := "(o.aggregate_id = '' OR NOT EXISTS (SELECT 1 FROM " + q.t + " AS e" +
		" WHERE e.aggregate_id = o.aggregate_id AND e.id < o.id AND e.published_at IS NULL AND " + blocker + "))"
	if q.d.kind == kindSQLite {
		s := "UPDATE " + q.t + " SET claimed_until = strftime('%Y-%m-%dT%H:%M:%fZ','now',?)" +
			" WHERE id IN (SELECT o.id FROM " + q.t + " AS o WHERE " + due +
			" AND (o.claimed_until IS NULL OR o.claimed_until <= " + now + ") AND " + notBlocked +
			" ORDER BY o.id LIMIT ?) RETURNING " + q.cols
		return q.d.rebind(s), []any{sqliteModifier(lease), limit}
	}
	n := o.PartitionCount
	if q.d.kind == kindMySQL {
		// No locks here: InnoDB locks every row its index scan reads
		// before the partition and order conditions are checked, so a
		// locking read would hold, for a moment, rows of partitions that
		// other claims serve, and their SKIP LOCKED would pass over an
		// aggregate's next event and take the one after it.
		s := "SELECT o.id FROM " + q.t + " AS o WHERE " + due +
			" AND FIND_IN_SET(" + mysqlPartitionExpr + ", ?) > 0 AND " + notBlocked +
			" ORDER BY o.id LIMIT ?"
		return s, []any{n, n, intList(o.Partitions), limit}
	}
	s := "SELECT " + q.cols + " FROM " + q.t + " AS o WHERE " + due +
		" AND " + partitionExpr + " = ANY(CAST(CAST(? AS text) AS bigint[])) AND " + notBlocked +
		" ORDER BY o.id LIMIT ? FOR UPDATE OF o SKIP LOCKED"
	return q.d.rebind(s), []any{n, n, intArray(o.Partitions), limit}
}

// LockOrdered returns, on MySQL, the second statement of an ordered claim:
// it locks the candidates ClaimOrdered selected, by primary key, waiting
// for the moment another claim's scan holds one, and returns those still
// due, in Seq order. The claim's partition locks keep every other claim
// from taking them meanwhile; a candidate an operator changed in between
// is left out (see sqlxoutbox for what the claim then drops).
func (q *Queries) LockOrdered(seqs []int64) (string, []any) {
	cols := strings.Split(eventColumns, ", ")
	for i, c := range cols {
		cols[i] = "o." + c
	}
	return "SELECT " + strings.Join(cols, ", ") + " FROM " + mysqlSeqTable + " AS j " + q.mysqlJoinSeqs("j") +
		" WHERE o.published_at IS NULL AND o.dead_at IS NULL AND o.next_attempt_at <= " + q.d.now() +
		" ORDER BY o.id FOR UPDATE", []any{q.seqArg(seqs)}
}

// PartitionOf returns, on PostgreSQL and MySQL, the query of the partition (one int
// column) of the event at seq for n partitions, as ClaimOrdered computes
// it; for tools and tests.
func (q *Queries) PartitionOf(seq int64, n int) (string, []any, error) {
	if q.d.kind == kindMySQL {
		return "SELECT " + mysqlPartitionExpr + " FROM " + q.t + " AS o WHERE o.id = ?", []any{n, n, seq}, nil
	}
	if q.d.kind != kindPostgres {
		return "", nil, fmt.Errorf("%w: partitions on %s", core.ErrUnsupported, q.d.Name())
	}
	return q.d.rebind("SELECT CAST(" + partitionExpr + " AS int) FROM " + q.t + " AS o WHERE o.id = ?"), []any{n, n, seq}, nil
}

func intArray(xs []int) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, x := range xs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(x))
	}
	b.WriteByte('}')
	return b.String()
}

// intList is xs as "1,2,3", the set FIND_IN_SET searches.
func intList(xs []int) string {
	var b strings.Builder
	for i, x := range xs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(x))
	}
	return b.String()
}

// jsonRange is the JSON array [0, 1, ..., n-1].
func jsonRange(n int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(i))
	}
	b.WriteByte(']')
	return b.String()
}
