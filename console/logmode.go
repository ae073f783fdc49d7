package console

import (
	"net/http"
	"time"
)

// logMode shows log mode's replication slot.
func (c *Console) logMode(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	st, err := c.opts.Slot(r.Context())
	if err != nil {
		c.fail(w, err)
		return
	}
	c.render(w, r, "logmode.html", "log", start, st)
}

// binlogMode shows log mode's binlog stream (MySQL, MariaDB).
func (c *Console) binlogMode(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	st, err := c.opts.Binlog(r.Context())
	if err != nil {
		c.fail(w, err)
		return
	}
	c.render(w, r, "binlogmode.html", "log", start, st)
}
