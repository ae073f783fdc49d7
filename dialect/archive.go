package dialect

import "time"

// ListPublished returns the query of at most limit events published before
// the given time, in Seq order: what an archiver writes out before it
// deletes them (DeleteArchived).
func (q *Queries) ListPublished(before time.Time, limit int) (string, []any) {
	return q.d.rebind("SELECT " + q.cols + " FROM " + q.t + " WHERE published_at < ? ORDER BY id LIMIT ?"),
		[]any{q.d.TimeArg(before), limit}
}

// DeleteArchived returns the DELETE of the events at seqs that are still
// published before the given time. An event made pending again since it was
// listed (a replay) is kept: its row no longer matches what was archived.
func (q *Queries) DeleteArchived(seqs []int64, before time.Time) (string, []any) {
	if q.d.kind == kindMySQL {
		// Joined as the relay's outcomes are (mysqlJoinSeqs): with IN
		// (SELECT … FROM JSON_TABLE) MariaDB reads the outbox's primary
		// key from its start and locks every row it passes, the rows the
		// relays claim among them.
		return "DELETE o FROM " + mysqlSeqTable + " AS j " + q.mysqlJoinSeqs("j") + " WHERE o.published_at < ?",
			[]any{q.seqArg(seqs), q.d.TimeArg(before)}
	}
	return q.d.rebind("DELETE FROM " + q.t + " WHERE id " + q.seqMatch() + " AND published_at < ?"),
		[]any{q.seqArg(seqs), q.d.TimeArg(before)}
}
