package console

import (
	"net/http"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
)

type inboxData struct {
	Consumers []sqlinbox.ConsumerStats
	EventID   string
	Found     []consumerAt
	Missing   []string
}

type consumerAt struct {
	Consumer string
	At       time.Time
}

// inbox shows the inbox's consumers, and where an event was processed.
func (c *Console) inboxPage(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	cs, err := c.opts.Inbox.Consumers(r.Context())
	if err != nil {
		c.fail(w, err)
		return
	}
	d := inboxData{Consumers: cs, EventID: strings.TrimSpace(r.URL.Query().Get("event_id"))}
	if d.EventID != "" {
		by, err := c.opts.Inbox.ProcessedBy(r.Context(), d.EventID)
		if err != nil {
			c.fail(w, err)
			return
		}
		for _, cst := range cs {
			if at, ok := by[cst.Consumer]; ok {
				d.Found = append(d.Found, consumerAt{cst.Consumer, at})
			} else {
				d.Missing = append(d.Missing, cst.Consumer)
			}
		}
	}
	c.render(w, r, "inbox.html", "inbox", start, d)
}
