package dialect

// MarkPublishedAsync is MarkPublished for a claim whose commit need not wait
// for its WAL flush: on PostgreSQL the same UPDATE also sets
// synchronous_commit to off for the rest of its transaction (set_config with
// is_local true, i.e. SET LOCAL), so the claim's COMMIT returns without
// waiting for the disk, and the relay saves a flush per batch without an
// extra round trip.
//
// This is safe for the mark and only for it: a mark lost in a crash of the
// database leaves the events unpublished in the table, so they are
// published again, and the consumers' inbox drops the duplicates. The
// producers' transactions, which carry the events themselves, keep the
// server's setting. On other dialects it returns MarkPublished's statement.
func (q *Queries) MarkPublishedAsync(seqs []int64) (string, []any) {
	if q.d.kind != kindPostgres {
		return q.MarkPublished(seqs)
	}
	return q.d.rebind("UPDATE " + q.t + " SET published_at = " + q.d.now() + ", attempt_count = attempt_count + 1, last_error = NULL" +
		" FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit" +
		" WHERE id " + q.seqMatch()), []any{q.seqArg(seqs)}
}
