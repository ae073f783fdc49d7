package dialect

import (
	"strings"

	"github.com/txoutbox/txoutbox/core"
)

// This file holds the PostgreSQL claim that marks as it claims.
//
// The textbook relay batch is four round trips and two passes over the
// rows: BEGIN; SELECT ... FOR UPDATE SKIP LOCKED (which writes a lock into
// every claimed tuple); publish; UPDATE ... SET published_at; COMMIT. The
// claim below takes the same row locks and writes the "published" row
// versions in one statement, inside the claim's transaction, before the
// batch is published. Nobody else can see those versions until COMMIT,
// which the store sends only once the broker has confirmed the batch; a
// failed publish rewrites the failed rows back to pending in the same
// transaction, and a crash or Release rolls the whole claim back. So the
// outcome that commits is exactly the one the textbook batch commits, with
// one statement and one tuple lock pass fewer per batch.
//
// The statement RETURNs the rows as they were before the claim
// (published_at NULL, the old attempt_count), so the relay sees the same
// events as from Claim.

// ClaimMarked returns the claim-and-mark statement (PostgreSQL only; "" on
// other dialects). Run it in a transaction of its own; its rows come back
// unordered (SortClaimed). With async, the same statement sets
// synchronous_commit off for its transaction, so the claim's COMMIT does not
// wait for the WAL flush (see MarkPublishedAsync for why that is safe).
func (q *Queries) ClaimMarked(limit int, async bool) (string, []any) {
	if q.d.kind != kindPostgres {
		return "", nil
	}
	if async {
		return q.claimMarkedAsync, []any{limit}
	}
	return q.claimMarked, []any{limit}
}

// UnclaimFailed returns the UPDATE that turns failed events of a
// ClaimMarked claim back into pending ones, recording the failure as
// MarkFailed does; the attempt was already counted by the claim
// (PostgreSQL only).
func (q *Queries) UnclaimFailed(fs []core.Failure) (string, []any, error) {
	return q.markFailed(fs, false)
}

// Unclaim returns the UPDATE that gives events of a ClaimMarked claim back
// unchanged: pending, the claim's attempt not counted (PostgreSQL only).
func (q *Queries) Unclaim(seqs []int64) (string, []any) {
	if q.d.kind != kindPostgres {
		return "", nil
	}
	return q.d.rebind("UPDATE " + q.t + " SET published_at = NULL, attempt_count = attempt_count - 1 WHERE id " + q.seqMatch()), []any{q.seqArg(seqs)}
}

// buildClaimMarked fills q.claimMarked and q.claimMarkedAsync.
func (q *Queries) buildClaimMarked(due string) {
	// The CTE is not inlined (it locks rows), so the LIMIT applies before
	// the join, exactly once.
	cols := strings.Split(eventColumns, ", ")
	for i, c := range cols {
		switch c {
		case "published_at":
			cols[i] = "CAST(NULL AS timestamptz)"
		case "attempt_count":
			cols[i] = "o.attempt_count - 1"
		default:
			cols[i] = "o." + c
		}
	}
	returning := strings.Join(cols, ", ")
	build := func(from string) string {
		return q.d.rebind("WITH claimed AS (SELECT id FROM " + q.t + " WHERE " + due +
			" ORDER BY next_attempt_at, id LIMIT ? FOR UPDATE SKIP LOCKED)" +
			" UPDATE " + q.t + " AS o SET published_at = " + q.d.now() + ", attempt_count = o.attempt_count + 1" +
			" FROM claimed" + from + " WHERE o.id = claimed.id RETURNING " + returning)
	}
	q.claimMarked = build("")
	q.claimMarkedAsync = build(", (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit")
}
