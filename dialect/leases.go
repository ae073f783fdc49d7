package dialect

import (
	"fmt"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// LeaseQueries is the SQL of partition leases for one outbox table (the
// relay group), on PostgreSQL and MySQL; the tables come from Migrate
// (ComponentOrdered). Every time is the database's, so relays with skewed
// clocks agree.
//
// Where the database has no UPDATE ... RETURNING (Returning reports false),
// Renew returns no rows: read them with Held. Acquire is then two
// statements in one transaction under ClaimTxOptions: AcquireCandidates
// locks the free rows, AcquireMark leases them.
type LeaseQueries struct {
	d      Dialect
	group  string
	leases string
	relays string
	p      string // the partition column, quoted where it is a reserved word
}

// Leases returns the lease statements of q's outbox table. It fails with an
// error wrapping core.ErrUnsupported on SQLite.
func (q *Queries) Leases() (*LeaseQueries, error) {
	if q.d.kind == kindSQLite {
		return nil, fmt.Errorf("%w: partition leases on %s (it runs one relay)", core.ErrUnsupported, q.d.Name())
	}
	prefix := ""
	if q.id.Schema != "" {
		prefix = q.d.quote(q.id.Schema) + "."
	}
	l := &LeaseQueries{
		d:      q.d,
		group:  q.id.String(),
		leases: prefix + q.d.quote(DefaultLeaseTable),
		relays: prefix + q.d.quote(DefaultRelayTable),
		p:      "partition",
	}
	if q.d.kind == kindMySQL {
		l.p = "`partition`"
	}
	return l, nil
}

// Group returns the relay group: the outbox table's name.
func (l *LeaseQueries) Group() string { return l.group }

// Returning reports whether Renew and Acquire return their rows (see the
// type's documentation).
func (l *LeaseQueries) Returning() bool { return l.d.kind != kindMySQL }

func (l *LeaseQueries) later() string { return l.d.later() }

func (l *LeaseQueries) mysql() bool { return l.d.kind == kindMySQL }

// PartitionCount returns the query of the number of partitions the group
// has rows for (0 before the first relay created them).
func (l *LeaseQueries) PartitionCount() (string, []any) {
	if l.mysql() {
		return "SELECT COUNT(*) FROM " + l.leases + " WHERE relay_group = ?", []any{l.group}
	}
	return l.d.rebind("SELECT CAST(count(*) AS int) FROM " + l.leases + " WHERE relay_group = ?"), []any{l.group}
}

// CreatePartitions returns the INSERT of the rows of partitions 0..n-1 that
// do not exist yet.
func (l *LeaseQueries) CreatePartitions(n int) (string, []any) {
	if l.mysql() {
		return "INSERT IGNORE INTO " + l.leases + " (relay_group, " + l.p + ")" +
			" SELECT ?, p FROM JSON_TABLE(?, '$[*]' COLUMNS (p INT PATH '$')) AS j", []any{l.group, jsonRange(n)}
	}
	return l.d.rebind("INSERT INTO " + l.leases + " (relay_group, partition)" +
		" SELECT ?, g FROM generate_series(0, CAST(? AS int) - 1) AS g ON CONFLICT DO NOTHING"), []any{l.group, n}
}

// Heartbeat returns the upsert that records owner as alive for ttl.
func (l *LeaseQueries) Heartbeat(owner string, ttl time.Duration) (string, []any) {
	if l.mysql() {
		return "INSERT INTO " + l.relays + " (relay_group, owner, expires_at) VALUES (?, ?, " + l.later() + ")" +
			" ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at)", []any{l.group, owner, ttl.Microseconds()}
	}
	return l.d.rebind("INSERT INTO " + l.relays + " (relay_group, owner, expires_at) VALUES (?, ?, " + l.later() + ")" +
		" ON CONFLICT (relay_group, owner) DO UPDATE SET expires_at = EXCLUDED.expires_at"), []any{l.group, owner, ttl.Microseconds()}
}

// LiveRelays returns the query of the number of relays whose heartbeat has
// not expired.
func (l *LeaseQueries) LiveRelays() (string, []any) {
	if l.mysql() {
		return "SELECT COUNT(*) FROM " + l.relays + " WHERE relay_group = ? AND expires_at > " + l.d.now(), []any{l.group}
	}
	return l.d.rebind("SELECT CAST(count(*) AS int) FROM " + l.relays + " WHERE relay_group = ? AND expires_at > " + l.d.now()), []any{l.group}
}

// PruneRelays returns the DELETE of heartbeats expired for longer than age.
func (l *LeaseQueries) PruneRelays(age time.Duration) (string, []any) {
	if l.mysql() {
		return "DELETE FROM " + l.relays + " WHERE relay_group = ? AND expires_at < " + l.d.now() +
			" - INTERVAL ? MICROSECOND", []any{l.group, age.Microseconds()}
	}
	return l.d.rebind("DELETE FROM " + l.relays + " WHERE relay_group = ? AND expires_at < " + l.d.now() +
		" - CAST(? AS bigint) * interval '1 microsecond'"), []any{l.group, age.Microseconds()}
}

// Leave returns the DELETE of owner's heartbeat.
func (l *LeaseQueries) Leave(owner string) (string, []any) {
	return l.d.rebind("DELETE FROM " + l.relays + " WHERE relay_group = ? AND owner = ?"), []any{l.group, owner}
}

// Renew returns the UPDATE extending every lease owner holds by ttl; its
// rows (one int column) are the partitions owner holds. A lease that
// expired but was not taken yet is renewed too: no one else served the
// partition in between.
func (l *LeaseQueries) Renew(owner string, ttl time.Duration) (string, []any) {
	if l.mysql() {
		return "UPDATE " + l.leases + " SET expires_at = " + l.later() +
			" WHERE relay_group = ? AND owner = ?", []any{ttl.Microseconds(), l.group, owner}
	}
	return l.d.rebind("UPDATE " + l.leases + " SET expires_at = " + l.later() +
		" WHERE relay_group = ? AND owner = ? RETURNING partition"), []any{ttl.Microseconds(), l.group, owner}
}

// Held returns the query of the partitions owner holds (one int column),
// to run after Renew where it returns none.
func (l *LeaseQueries) Held(owner string) (string, []any) {
	return l.d.rebind("SELECT " + l.p + " FROM " + l.leases + " WHERE relay_group = ? AND owner = ?"), []any{l.group, owner}
}

// AcquireCandidates returns, where Acquire is two statements, the locking
// read of up to k free or expired partitions: rows (partition int,
// previous owner text, "" when free), skipping those another relay is
// taking.
func (l *LeaseQueries) AcquireCandidates(k int) (string, []any) {
	return l.d.rebind("SELECT " + l.p + ", COALESCE(owner, '') FROM " + l.leases +
		" WHERE relay_group = ? AND (owner IS NULL OR expires_at <= " + l.d.now() + ")" +
		" ORDER BY " + l.p + " LIMIT ? FOR UPDATE SKIP LOCKED"), []any{l.group, k}
}

// AcquireMark returns the UPDATE that leases partitions, locked by
// AcquireCandidates in the same transaction, to owner for ttl.
func (l *LeaseQueries) AcquireMark(owner string, ttl time.Duration, partitions []int) (string, []any) {
	return l.d.rebind("UPDATE " + l.leases + " SET owner = ?, expires_at = " + l.later() + ", acquired_at = " + l.d.now() +
		" WHERE relay_group = ? AND FIND_IN_SET(" + l.p + ", ?) > 0"), []any{owner, ttl.Microseconds(), l.group, intList(partitions)}
}

// Acquire returns the statement that leases up to k free or expired
// partitions to owner for ttl. Its rows are (partition int, previous owner
// text, "" when the partition was free); a previous owner other than owner
// means a takeover of an expired lease: a failover. Rows another relay is
// taking at the same moment are skipped.
//
// Where Returning is false it returns "": use AcquireCandidates and
// AcquireMark.
func (l *LeaseQueries) Acquire(owner string, ttl time.Duration, k int) (string, []any) {
	if !l.Returning() {
		return "", nil
	}
	now := l.d.now()
	return l.d.rebind("WITH free AS (SELECT partition, owner FROM " + l.leases +
		" WHERE relay_group = ? AND (owner IS NULL OR expires_at <= " + now + ")" +
		" ORDER BY partition LIMIT ? FOR UPDATE SKIP LOCKED)" +
		" UPDATE " + l.leases + " AS l SET owner = ?, expires_at = " + l.later() + ", acquired_at = " + now +
		" FROM free WHERE l.relay_group = ? AND l.partition = free.partition" +
		" RETURNING l.partition, COALESCE(free.owner, '')"), []any{l.group, k, owner, ttl.Microseconds(), l.group}
}

// Release returns the UPDATE that gives up owner's leases of partitions
// (nil: all of them), so that other relays can take them at once.
func (l *LeaseQueries) Release(owner string, partitions []int) (string, []any) {
	s := "UPDATE " + l.leases + " SET owner = NULL, expires_at = " + l.d.now() + " WHERE relay_group = ? AND owner = ?"
	args := []any{l.group, owner}
	switch {
	case partitions == nil:
	case l.mysql():
		s += " AND FIND_IN_SET(" + l.p + ", ?) > 0"
		args = append(args, intList(partitions))
	default:
		s += " AND partition = ANY(CAST(CAST(? AS text) AS int[]))"
		args = append(args, intArray(partitions))
	}
	return l.d.rebind(s), args
}

// List returns the query of every partition's lease: (partition int, owner
// text, "" when free, live bool), in partition order.
func (l *LeaseQueries) List() (string, []any) {
	return l.d.rebind("SELECT " + l.p + ", COALESCE(owner, ''), owner IS NOT NULL AND expires_at > " + l.d.now() +
		" FROM " + l.leases + " WHERE relay_group = ? ORDER BY " + l.p), []any{l.group}
}
