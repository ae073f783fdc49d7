package logstream

import (
	"context"
	"time"
)

// Verdict is what a reader makes of the error that ended a session.
type Verdict int

const (
	// Lost: the connection or the server failed; reconnect with backoff.
	Lost Verdict = iota
	// Standby: another relay streams; try again every StandbyInterval.
	Standby
	// Fatal: the log cannot be streamed at all (no slot, binlog purged);
	// Loop returns the error.
	Fatal
)

// LoopOptions configures Loop.
type LoopOptions struct {
	// Key and Name name what is streamed in the log lines ("slot",
	// "txoutbox").
	Key, Name string
	// StandbyInterval is how often a standing-by relay tries again.
	StandbyInterval time.Duration
	// Session streams once, from connecting to the first error; it calls
	// started once it streams.
	Session func(ctx context.Context, started func()) error
	// Classify judges the error that ended a session; detail, if not
	// empty, is logged with a Standby.
	Classify func(err error) (v Verdict, detail string)
}

// Loop keeps one streaming session going until ctx ends, standing by while
// another relay streams and reconnecting with backoff after a failure. It
// logs the changes of state once each: streaming, standing by, taking
// over, lost, streaming again. It returns nil when ctx ends, and the error
// of a Fatal session.
func (s *Stream) Loop(ctx context.Context, o LoopOptions) error {
	var (
		standing bool
		lost     time.Time
		wait     = 100 * time.Millisecond
	)
	for {
		err := o.Session(ctx, func() {
			switch {
			case standing:
				s.log.Info("txoutbox: log: took the "+o.Key+" over; streaming", o.Key, o.Name)
			case !lost.IsZero():
				s.log.Info("txoutbox: log: streaming again", o.Key, o.Name, "after", time.Since(lost).Round(time.Millisecond))
			default:
				s.log.Info("txoutbox: log: streaming", o.Key, o.Name, "ordered", s.order)
			}
			standing, lost, wait = false, time.Time{}, 100*time.Millisecond
			s.storeDown.Store(false)
		})
		s.Stopped()
		if ctx.Err() != nil {
			return nil
		}
		v, detail := o.Classify(err)
		switch v {
		case Fatal:
			s.log.Error("txoutbox: log: cannot stream", o.Key, o.Name, "error", err)
			return err
		case Standby:
			if !standing {
				s.log.Info("txoutbox: log: another relay streams the "+o.Key+"; standing by", o.Key, o.Name, "detail", detail)
				standing = true
			}
			if !sleep(ctx, o.StandbyInterval) {
				return nil
			}
			continue
		}
		if lost.IsZero() {
			lost = time.Now()
			s.storeDown.Store(true)
			s.log.Warn("txoutbox: log: stream lost; reconnecting with backoff (logged once until it streams again)", o.Key, o.Name, "error", err)
		} else {
			s.log.Debug("txoutbox: log: reconnect failed", "error", err)
		}
		if !sleep(ctx, wait) {
			return nil
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
