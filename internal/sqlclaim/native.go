package sqlclaim

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// This file drives a claim-and-mark claim (QueryMarked) on pgx's own
// connection under database/sql, when the pool's driver is pgx's stdlib.
//
// Why: the relay's hot path is one claim statement returning a batch of
// rows, and through database/sql every column of every row is boxed into a
// driver.Value and converted again into its destination, which cost the
// relay as much client CPU as the rest of the batch together (profiled:
// CollectEvents was 45 % of the relay's CPU, on two cores shared with the
// database). Scanning pgx's binary values straight into typed variables
// removes most of that, and pgx's pipelining sends BEGIN with the claim and
// the outcome's UPDATEs with COMMIT, so that a batch costs two round trips.
//
// The transaction lives on a *sql.Conn reserved from the pool for the life
// of the claim; database/sql does not know it is open, so every way out
// either leaves the connection idle (checked with its transaction status)
// or tells database/sql to discard it (driver.ErrBadConn), which closes the
// session and so rolls the transaction back on the server.

// Native reports whether db's connections are pgx's, which
// QueryMarkedNative needs: call it only on such a pool.
func Native(db *sql.DB) bool {
	_, ok := db.Driver().(*stdlib.Driver)
	return ok
}

// QueryMarkedNative is QueryMarked on pgx's connection: it reserves a
// connection of c.DB, sends BEGIN and the claim-and-mark query in one round
// trip and returns the claim holding that transaction, its events in claim
// order; limit is the claim's LIMIT. On an error, or when nothing was
// claimed, the connection goes back to the pool with no transaction open.
func (c *Claimer) QueryMarkedNative(ctx context.Context, query string, args []any, limit int) (core.Claim, error) {
	return c.queryNative(ctx, query, args, limit, false)
}

// QueryLockedNative is QueryMarkedNative for a claim query that only locks
// its rows (dialect.Queries.Claim): Commit then writes the whole outcome
// (Mark's statements) with COMMIT, in one round trip.
func (c *Claimer) QueryLockedNative(ctx context.Context, query string, args []any, limit int) (core.Claim, error) {
	return c.queryNative(ctx, query, args, limit, true)
}

func (c *Claimer) queryNative(ctx context.Context, query string, args []any, limit int, locked bool) (core.Claim, error) {
	conn, err := c.DB.Conn(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("%s: claim: %w", c.Prefix, err)
	}
	var evs []core.Event
	err = conn.Raw(func(dc any) error {
		// Native accepted the pool: its driver opens only *stdlib.Conn.
		pc := dc.(*stdlib.Conn).Conn()
		var qerr error
		evs, qerr = claimNative(ctx, pc, query, args, limit)
		if qerr != nil || len(evs) == 0 {
			return errors.Join(qerr, endNative(pc, "ROLLBACK"))
		}
		return nil
	})
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("%s: claim: %w", c.Prefix, err)
	}
	if len(evs) == 0 {
		if err := conn.Close(); err != nil {
			return nil, fmt.Errorf("%s: claim: %w", c.Prefix, err)
		}
		return c.Empty(), nil
	}
	dialect.SortClaimed(evs)
	return &nativeClaim{base: newBase(evs), c: c, conn: conn, locked: locked}, nil
}

func claimNative(ctx context.Context, pc *pgx.Conn, query string, args []any, limit int) ([]core.Event, error) {
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(query, args...)
	br := pc.SendBatch(ctx, &b)
	if _, err := br.Exec(); err != nil {
		return nil, errors.Join(err, br.Close())
	}
	rows, err := br.Query()
	if err != nil {
		return nil, errors.Join(err, br.Close())
	}
	evs, err := ScanPgx(rows, limit)
	return evs, errors.Join(err, br.Close())
}

// ScanPgx reads and closes the rows of an event-returning statement (the columns
// of dialect's event statements, in their order), expecting at most limit.
func ScanPgx(rows pgx.Rows, limit int) ([]core.Event, error) {
	defer rows.Close()
	// Sized for a full batch: growing a slice of events by doubling copied
	// each of them several times.
	evs := make([]core.Event, 0, limit)
	// One set of scan targets for all rows: declared in the loop, each
	// row's would escape to the heap through rows.Scan. pgx copies what it
	// scans into []byte and string, so nothing below aliases a later row.
	var (
		seq                   int64
		id                    pgtype.UUID
		aggType, aggID, evTyp string
		payload, headers      []byte
		published, dead       pgtype.Timestamptz
		attempts              int32
		lastError             pgtype.Text
		created, nextAttempt  time.Time
	)
	dest := []any{&seq, &id, &aggType, &aggID, &evTyp, &payload, &headers,
		&created, &published, &attempts, &lastError, &nextAttempt, &dead}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		h, err := dialect.DecodeHeaders(headers)
		if err != nil {
			return nil, fmt.Errorf("headers of event %d: %w", seq, err)
		}
		evs = append(evs, core.Event{
			Seq:           seq,
			ID:            uuid.UUID(id.Bytes).String(),
			AggregateType: aggType,
			AggregateID:   aggID,
			EventType:     evTyp,
			Payload:       json.RawMessage(payload),
			Headers:       h,
			CreatedAt:     created,
			PublishedAt:   timePtr(published),
			AttemptCount:  int(attempts),
			LastError:     lastError.String,
			NextAttemptAt: nextAttempt,
			DeadAt:        timePtr(dead),
		})
	}
	return evs, rows.Err()
}

func timePtr(t pgtype.Timestamptz) *time.Time {
	if !t.Valid {
		return nil
	}
	v := t.Time
	return &v
}

// endNative ends the connection's transaction with stmt (COMMIT or
// ROLLBACK) and reports driver.ErrBadConn, so that database/sql discards
// the connection, unless it is idle afterwards. A COMMIT of a failed
// transaction is a rollback, which it reports as an error.
func endNative(pc *pgx.Conn, stmt string) error {
	return endNativeBatch(context.Background(), pc, stmt, nil)
}

// endNativeBatch sends the queued statements of b (may be nil) and then
// stmt, in one round trip.
func endNativeBatch(ctx context.Context, pc *pgx.Conn, stmt string, b *pgx.Batch) error {
	var (
		tag string
		err error
	)
	if b == nil || b.Len() == 0 {
		// Alone, stmt is one simple-protocol message: cheaper than a
		// pipeline, which pgx drives with a second reader goroutine.
		var ct pgconn.CommandTag
		ct, err = pc.Exec(ctx, stmt)
		tag = ct.String()
	} else {
		n := b.Len()
		b.Queue(stmt)
		br := pc.SendBatch(ctx, b)
		for range n {
			if _, err = br.Exec(); err != nil {
				break
			}
		}
		if err == nil {
			ct, terr := br.Exec()
			tag, err = ct.String(), terr
		}
		err = errors.Join(err, br.Close())
	}
	if err == nil && stmt == "COMMIT" && tag != "COMMIT" {
		err = fmt.Errorf("COMMIT ended as %q: %w", tag, pgx.ErrTxCommitRollback)
	}
	if err != nil && stmt == "COMMIT" && pc.PgConn().TxStatus() != 'I' && !pc.IsClosed() {
		// The outcome failed half-way: roll back, as a crash would.
		err = errors.Join(err, endNative(pc, "ROLLBACK"))
	}
	if pc.IsClosed() || pc.PgConn().TxStatus() != 'I' {
		return errors.Join(err, driver.ErrBadConn)
	}
	return err
}

// nativeClaim is a claim held on a reserved connection: a claim-and-mark
// claim, or with locked one whose rows are only locked.
type nativeClaim struct {
	base
	c      *Claimer
	conn   *sql.Conn
	locked bool
}

// Commit writes the outcome and commits, in one round trip: a
// claim-and-mark claim turns the failed and the unmentioned events back
// into pending ones (the rest is then published); a locked one runs Mark's
// statements, and the commit releases the unmentioned events untouched.
func (n *nativeClaim) Commit(ctx context.Context, out core.Outcome) error {
	if err := n.finish(); err != nil {
		return err
	}
	var stmts []statement
	var err error
	if n.locked {
		if _, err = n.check(out); err == nil {
			stmts, err = n.c.outcome(out)
		}
	} else {
		stmts, err = n.markedOutcome(n.c.Q, out)
	}
	if err != nil {
		return errors.Join(err, n.end(ctx, "ROLLBACK", nil))
	}
	var b pgx.Batch
	for _, st := range stmts {
		b.Queue(st.query, st.args...)
	}
	if err := n.end(ctx, "COMMIT", &b); err != nil {
		return fmt.Errorf("%s: commit claim: %w", n.c.Prefix, err)
	}
	return nil
}

// Release rolls the claim's transaction back.
func (n *nativeClaim) Release(ctx context.Context) error {
	if err := n.finish(); err != nil {
		return err
	}
	if err := n.end(ctx, "ROLLBACK", nil); err != nil {
		return fmt.Errorf("%s: release claim: %w", n.c.Prefix, err)
	}
	return nil
}

// end runs the batch and stmt on the reserved connection and gives the
// connection back to the pool, or has it discarded.
func (n *nativeClaim) end(ctx context.Context, stmt string, b *pgx.Batch) error {
	err := n.conn.Raw(func(dc any) error {
		return endNativeBatch(ctx, dc.(*stdlib.Conn).Conn(), stmt, b)
	})
	if err != nil {
		// A discarded connection is closed already.
		_ = n.conn.Close()
		return err
	}
	return n.conn.Close()
}
