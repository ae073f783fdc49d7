// Package poolwatch notices a database/sql pool that closes a connection
// after nearly every use: more goroutines use the pool at once than it
// keeps idle (two by default), so each transaction past the second opens a
// server connection, and closes it on its return. On PostgreSQL that is a
// process fork per transaction: in the bench the server's CPU per event
// rose fivefold and the p99 latency tenfold. A store calls Check now and
// then (its Stats), which logs the fix once.
package poolwatch

import (
	"database/sql"
	"log/slog"
	"sync"
	"time"
)

// Churn is how many connections per second the pool may close for want of
// an idle slot before Check warns: a few are normal after a burst.
const Churn = 10

// Watch remembers the pool's count of such closes between checks.
type Watch struct {
	mu     sync.Mutex
	last   int64
	at     time.Time
	warned bool
}

// Check compares db's MaxIdleClosed with the previous check and, the first
// time it grew by more than Churn per second, logs a warning with the fix.
// It reports whether the pool churned since the previous check.
func (w *Watch) Check(db *sql.DB, log *slog.Logger) bool {
	st := db.Stats()
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	prev, at := w.last, w.at
	w.last, w.at = st.MaxIdleClosed, now
	if at.IsZero() {
		return false
	}
	closed := st.MaxIdleClosed - prev
	secs := now.Sub(at).Seconds()
	if closed < Churn || float64(closed)/secs < Churn {
		return false
	}
	if !w.warned {
		w.warned = true
		log.Warn("txoutbox: the database pool closes connections it has no idle slot for: most transactions open a new server connection; "+
			"keep as many idle as the pool's concurrent users (producers, relay workers): db.SetMaxIdleConns(n), with n at least those users, "+
			"or equal to db.SetMaxOpenConns (database/sql keeps 2 by default); logged once",
			"closed", closed, "seconds", round(secs), "max_idle_closed_total", st.MaxIdleClosed, "open", st.OpenConnections, "max_open", st.MaxOpenConnections)
	}
	return true
}

func round(s float64) float64 { return float64(int(s*10)) / 10 }
