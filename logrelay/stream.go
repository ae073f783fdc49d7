package logrelay

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/logstream"
)

// classify judges the error that ended a session: no slot, an
// invalidated one, or a pooler in the way cannot be streamed; a slot in
// use (55006) is another relay's; anything else is a lost connection.
func classify(err error) (logstream.Verdict, string) {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, ErrNoSlot), errors.Is(err, ErrSlotInvalidated), errors.Is(err, ErrPooler), errors.Is(err, ErrOutdatedTrigger):
		return logstream.Fatal, ""
	case errors.As(err, &pgErr) && pgErr.Code == "55006":
		return logstream.Standby, pgErr.Message
	}
	return logstream.Lost, ""
}

// refusedByPooler tells PgBouncer's refusal of a replication connection.
// PgBouncer refuses the first startup parameter it does not know, and
// the startup message sends them in no set order, so "replication" is
// one of several it may name (wal_sender_timeout, or one the user put in
// the DSN); PostgreSQL itself words an unknown parameter otherwise.
func refusedByPooler(err error) bool {
	return strings.Contains(err.Error(), "unsupported startup parameter")
}

// session streams once: from connecting to the first error.
func (r *source) session(ctx context.Context, started func()) error {
	var start pglogrepl.LSN
	var walStatus string
	err := r.pool.QueryRow(ctx, "SELECT confirmed_flush_lsn::text, coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1", r.names.slot).
		Scan(&start, &walStatus)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %s (create it with txoutbox log create)", ErrNoSlot, r.names.slot)
	}
	if err != nil {
		return err
	}
	if walStatus == "lost" {
		return fmt.Errorf("%w: slot %s (wal_status lost): events written while it fell behind may be missing", ErrSlotInvalidated, r.names.slot)
	}
	// After a server crash the slot may be back at a position it kept on
	// disk, older than the one the relays confirmed and recorded: start
	// from the later. The server starts at the slot's position when it is
	// the later one.
	if rec := r.recorded(ctx); rec > start {
		r.stream.Logger().Info("txoutbox: log: the slot is behind the position the relays recorded (a server crash); streaming from the recorded one",
			"slot", r.names.slot, "slot_position", start, "recorded", rec)
		start = rec
	}
	conn, err := pgconn.ConnectConfig(ctx, r.repl)
	if err != nil {
		if refusedByPooler(err) {
			return fmt.Errorf("%w: %w", ErrPooler, err)
		}
		return err
	}
	defer conn.Close(context.Background())
	// After the replication connection: a pooler in the way is named
	// first (ErrPooler).
	if err := updateTrigger(ctx, r.pool, r.names); err != nil {
		return err
	}
	err = pglogrepl.StartReplication(ctx, conn, r.names.slot, start, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + r.names.pub + "'", "messages 'true'"},
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55000" {
			return fmt.Errorf("%w: %s", ErrSlotInvalidated, pgErr.Message)
		}
		if errors.As(err, &pgErr) && pgErr.Code == "42704" {
			return fmt.Errorf("%w: %s", ErrNoSlot, pgErr.Message)
		}
		return err
	}
	r.stream.Started(uint64(start))
	started()

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	items := make(chan logstream.Item, 256)
	var wg sync.WaitGroup
	var pubErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		if pubErr = r.stream.Publish(sctx, items); pubErr != nil {
			cancel()
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.record(sctx, uint64(start))
	}()
	recvErr := r.receive(sctx, conn, items)
	cancel()
	wg.Wait()
	if ctx.Err() != nil {
		// A graceful stop: record what was confirmed last.
		fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		r.storeRecorded(fctx, r.stream.Confirmed())
		fcancel()
	}
	// The side that failed first cancelled the other: report its error,
	// not the cancellation it caused.
	for _, err := range []error{pubErr, recvErr} {
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return cmp.Or(pubErr, recvErr)
}

// receive reads the stream, decodes the outbox's messages into items, and
// reports the confirmed position to the server.
func (r *source) receive(ctx context.Context, conn *pgconn.PgConn, out chan<- logstream.Item) error {
	var (
		cur        *logstream.Item // the transaction being read
		sent       = r.stream.Confirmed()
		sentAt     time.Time
		lastServer = time.Now()
		nextStatus time.Time
	)
	status := func(ask bool) error {
		pos := r.stream.Confirmed()
		if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: pglogrepl.LSN(pos), ReplyRequested: ask,
		}); err != nil {
			return err
		}
		if pos != sent {
			r.stream.Confirmation()
		}
		sent, sentAt = pos, time.Now()
		return nil
	}
	// push hands it to the publisher; the server keeps hearing from the
	// relay while the publisher is busy. The relay reads nothing meanwhile,
	// so that wait does not count as the server's silence: a publisher
	// held up by its broker is no reason to drop a live stream.
	push := func(it logstream.Item) error {
		began := time.Now()
		defer func() { lastServer = lastServer.Add(time.Since(began)) }()
		for {
			select {
			case out <- it:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(min(time.Second, r.opts.ServerTimeout/4)):
				// Well within the server's wal_sender_timeout (set to
				// ServerTimeout), which it counts from the last reply.
				if err := status(false); err != nil {
					return err
				}
			}
		}
	}
	// With ConfirmInterval 0, a confirmed position that moves cuts the
	// current read short, so that the loop sends it at once rather than
	// after the read's 20 ms.
	wake := r.opts.ConfirmInterval == 0
	var reading atomic.Pointer[context.CancelFunc]
	if wake {
		// Joined before receive returns, and reading only its own copy of
		// the channel: nothing of the session outlives it.
		moved := r.stream.Moved()
		wakeDone, wakeExited := make(chan struct{}), make(chan struct{})
		defer func() { close(wakeDone); <-wakeExited }()
		go func() {
			defer close(wakeExited)
			for {
				select {
				case <-wakeDone:
					return
				case <-moved:
					if cancel := reading.Load(); cancel != nil {
						(*cancel)()
					}
				}
			}
		}()
	}
	for {
		now := time.Now()
		if now.After(nextStatus) || r.stream.Confirmed() != sent && now.Sub(sentAt) >= r.opts.ConfirmInterval {
			ask := now.After(nextStatus)
			if err := status(ask); err != nil {
				return err
			}
			if ask {
				nextStatus = now.Add(time.Second)
			}
		}
		if now.Sub(lastServer) > r.opts.ServerTimeout {
			return fmt.Errorf("logrelay: the server sent nothing for %s", now.Sub(lastServer).Round(time.Millisecond))
		}
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Millisecond)
		reading.Store(&rcancel)
		if wake && r.stream.Confirmed() != sent {
			// Moved since the check above: its wake-up may have come
			// before the read could be cut short.
			rcancel()
		}
		msg, err := conn.ReceiveMessage(rctx)
		reading.Store(nil)
		rcancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Cut short by a wake-up, or timed out: a timed-out read
			// leaves the connection usable, with any partial message kept.
			if pgconn.Timeout(err) || errors.Is(err, context.Canceled) {
				continue
			}
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		case *pgproto3.CopyData:
			lastServer = time.Now()
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return err
				}
				if ka.ReplyRequested {
					if err := status(false); err != nil {
						return err
					}
				}
				// Between transactions everything before the server's
				// position was sent: confirm it once what came before is
				// handled, so that an idle outbox does not hold WAL back.
				if cur == nil {
					if err := push(logstream.Item{End: uint64(ka.ServerWALEnd)}); err != nil {
						return err
					}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return err
				}
				lm, err := pglogrepl.Parse(xld.WALData)
				if err != nil {
					continue // a message kind log mode has no use for
				}
				switch v := lm.(type) {
				case *pglogrepl.BeginMessage:
					cur = &logstream.Item{Commit: v.CommitTime}
				case *pglogrepl.LogicalDecodingMessage:
					if cur == nil || !v.Transactional || v.Prefix != r.names.prefix {
						continue
					}
					ev, err := decodeEvent(v.Content)
					if err != nil {
						// A row the trigger wrote cannot fail to decode;
						// stopping here keeps it in the slot for a fix.
						return fmt.Errorf("logrelay: decode event at %s: %w", v.LSN, err)
					}
					cur.Events = append(cur.Events, ev)
				case *pglogrepl.CommitMessage:
					if cur == nil {
						continue
					}
					it := *cur
					cur = nil
					it.End = uint64(v.TransactionEndLSN)
					r.stream.Received(it)
					if err := push(it); err != nil {
						return err
					}
				}
			}
		}
	}
}

// header is the first line of a message: the event's fields but its
// payload (see messagePrefix).
type header struct {
	ID            int64             `json:"id"`
	EventID       string            `json:"event_id"`
	AggregateType string            `json:"aggregate_type"`
	AggregateID   string            `json:"aggregate_id"`
	EventType     string            `json:"event_type"`
	Headers       map[string]string `json:"headers"`
	CreatedAt     time.Time         `json:"created_at"`
	NextAttempt   time.Time         `json:"next_attempt_at"`
}

func decodeEvent(b []byte) (core.Event, error) {
	line, payload, ok := bytes.Cut(b, []byte{'\n'})
	if !ok {
		return core.Event{}, errors.New("no newline between the header and the payload")
	}
	var h header
	if err := json.Unmarshal(line, &h); err != nil {
		return core.Event{}, err
	}
	ev := core.Event{
		Seq: h.ID, ID: h.EventID, AggregateType: h.AggregateType, AggregateID: h.AggregateID,
		EventType: h.EventType, Payload: bytes.Clone(payload), Headers: h.Headers,
		CreatedAt: h.CreatedAt, NextAttemptAt: h.CreatedAt,
	}
	if h.NextAttempt.After(h.CreatedAt) {
		// Scheduled: the stream hands it to the table.
		ev.NotBefore, ev.NextAttemptAt = h.NextAttempt, h.NextAttempt
	}
	return ev, nil
}

// recordEvery is how often a streaming relay records its confirmed
// position in PositionsTable: what a server crash can make the next relay
// send again.
const recordEvery = time.Second

// recorded is the position the relays recorded for the slot, or 0.
func (r *source) recorded(ctx context.Context) pglogrepl.LSN {
	var s string
	if err := r.pool.QueryRow(ctx, "SELECT lsn::text FROM "+r.names.positions+" WHERE slot = $1", r.names.slot).Scan(&s); err != nil {
		return 0 // none yet, or a setup older than the table
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return 0
	}
	return lsn
}

// record records the confirmed position every recordEvery while it moves,
// until ctx ends.
func (r *source) record(ctx context.Context, from uint64) {
	t := time.NewTicker(recordEvery)
	defer t.Stop()
	last := from
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if pos := r.stream.Confirmed(); pos > last && r.storeRecorded(ctx, pos) {
			last = pos
		}
	}
}

// storeRecorded records pos; a failure (the database down, a setup older
// than the table) only means a longer resend after a crash.
func (r *source) storeRecorded(ctx context.Context, pos uint64) bool {
	_, err := r.pool.Exec(ctx, "INSERT INTO "+r.names.positions+" (slot, lsn, updated_at) VALUES ($1, $2::text::pg_lsn, now())"+
		" ON CONFLICT (slot) DO UPDATE SET lsn = greatest("+r.names.positions+".lsn, EXCLUDED.lsn), updated_at = now()",
		r.names.slot, pglogrepl.LSN(pos).String())
	if err != nil {
		r.stream.Logger().Debug("txoutbox: log: record the confirmed position", "error", err)
		return false
	}
	return true
}
