package console

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/txoutbox/txoutbox/dialect"
)

// page is what every template gets.
type page struct {
	Title, Nav string
	// HasInbox and HasLog show the inbox and log mode pages in the menu.
	HasInbox, HasLog bool
	// Base is the path the console is mounted under (Options.Prefix).
	Base     string
	ReadOnly bool
	CSRF     string
	Flash    string
	Took     time.Duration
	Data     any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, name, nav string, start time.Time, data any) {
	p := page{Title: c.opts.Title, Nav: nav, Base: c.opts.Prefix, HasInbox: c.opts.Inbox != nil, HasLog: c.opts.Slot != nil || c.opts.Binlog != nil, ReadOnly: c.opts.ReadOnly, CSRF: c.csrfToken(c.user(r)),
		Flash: r.URL.Query().Get("flash"), Took: time.Since(start), Data: data}
	var buf bytes.Buffer
	if err := c.tmpl.ExecuteTemplate(&buf, name, p); err != nil {
		c.fail(w, fmt.Errorf("render %s: %w", name, err))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = buf.WriteTo(w)
}

func (c *Console) fail(w http.ResponseWriter, err error) {
	c.log.Error("txoutbox: console: page failed", "error", err)
	code := http.StatusInternalServerError
	if errors.Is(err, dialect.ErrInvalidFilter) || errors.Is(err, errBadInput) {
		code = http.StatusBadRequest
	}
	http.Error(w, err.Error(), code)
}

var errBadInput = errors.New("console: bad input")

// parseTime reads a time of the events form: RFC 3339, or the
// datetime-local input's "2006-01-02T15:04" (UTC).
func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%w: time %q (want 2006-01-02T15:04 or RFC 3339)", errBadInput, s)
}
