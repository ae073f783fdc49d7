package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

type eventsData struct {
	Filter dialect.EventFilter
	Query  url.Values
	From   string
	To     string
	Events []core.Event
	Next   int64
}

func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	q := r.URL.Query()
	// An event ID or a Seq goes straight to the event.
	if id := strings.TrimSpace(q.Get("id")); id != "" {
		ev, err := c.store.Get(r.Context(), id)
		if err != nil {
			if errors.Is(err, core.ErrEventNotFound) {
				c.render(w, r, "notfound.html", "events", start, "event "+id)
				return
			}
			c.fail(w, err)
			return
		}
		http.Redirect(w, r, c.opts.Prefix+"/events/"+strconv.FormatInt(ev.Seq, 10), http.StatusSeeOther)
		return
	}
	f := dialect.EventFilter{EventType: q.Get("type"), AggregateType: q.Get("aggregate_type"),
		AggregateID: q.Get("aggregate_id"), State: q.Get("state")}
	var err error
	if f.CreatedFrom, err = parseTime(q.Get("from")); err != nil {
		c.fail(w, err)
		return
	}
	if f.CreatedTo, err = parseTime(q.Get("to")); err != nil {
		c.fail(w, err)
		return
	}
	before, _ := strconv.ParseInt(q.Get("before"), 10, 64)
	const limit = 50
	evs, err := c.store.ListEvents(r.Context(), f, dialect.EventPage{BeforeSeq: before, Limit: limit})
	if err != nil {
		c.fail(w, err)
		return
	}
	d := eventsData{Filter: f, Query: q, From: q.Get("from"), To: q.Get("to"), Events: evs}
	if len(evs) == limit {
		d.Next = evs[len(evs)-1].Seq
	}
	c.render(w, r, "events.html", "events", start, d)
}

type eventData struct {
	Event    core.Event
	Payload  string
	Headers  []header
	State    string
	Timeline []step
}

type header struct{ Key, Value string }

type step struct {
	At   time.Time
	What string
}

func (c *Console) lookup(r *http.Request) (core.Event, error) {
	seq, err := strconv.ParseInt(r.PathValue("seq"), 10, 64)
	if err != nil || seq <= 0 {
		return core.Event{}, fmt.Errorf("%w: seq %q", errBadInput, r.PathValue("seq"))
	}
	return c.store.GetBySeq(r.Context(), seq)
}

func (c *Console) event(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ev, err := c.lookup(r)
	if errors.Is(err, core.ErrEventNotFound) {
		c.render(w, r, "notfound.html", "events", start, "event #"+r.PathValue("seq"))
		return
	}
	if err != nil {
		c.fail(w, err)
		return
	}
	d := eventData{Event: ev, Payload: prettyJSON(ev.Payload), State: state(ev)}
	for k, v := range ev.Headers {
		d.Headers = append(d.Headers, header{k, v})
	}
	slices.SortFunc(d.Headers, func(a, b header) int { return strings.Compare(a.Key, b.Key) })
	d.Timeline = append(d.Timeline, step{ev.CreatedAt, "written"})
	if ev.AttemptCount > 0 && ev.LastError != "" {
		d.Timeline = append(d.Timeline, step{ev.NextAttemptAt, fmt.Sprintf("%d failed attempts; next attempt due", ev.AttemptCount)})
	}
	if ev.PublishedAt != nil {
		d.Timeline = append(d.Timeline, step{*ev.PublishedAt, "published"})
	}
	if ev.DeadAt != nil {
		d.Timeline = append(d.Timeline, step{*ev.DeadAt, "dead-lettered"})
	}
	slices.SortStableFunc(d.Timeline, func(a, b step) int { return a.At.Compare(b.At) })
	c.render(w, r, "event.html", "events", start, d)
}

func state(ev core.Event) string {
	switch {
	case ev.DeadAt != nil:
		return "dead"
	case ev.PublishedAt != nil:
		return "published"
	case ev.AttemptCount > 0:
		return "retrying"
	}
	return "pending"
}

func prettyJSON(b []byte) string {
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "  "); err != nil {
		return string(b)
	}
	return buf.String()
}

// replayAction publishes a published event again (same ID), after a
// confirmation.
func (c *Console) replayAction(w http.ResponseWriter, r *http.Request, user string) {
	start := time.Now()
	ev, err := c.lookup(r)
	if err != nil {
		c.fail(w, err)
		return
	}
	path := "/events/" + strconv.FormatInt(ev.Seq, 10)
	if ev.PublishedAt == nil {
		c.fail(w, fmt.Errorf("%w: event #%d is not published (replay re-publishes published events; a dead one is retried from the dead letters)", errBadInput, ev.Seq))
		return
	}
	if r.PostForm.Get("confirm") != "yes" {
		c.render(w, r, "confirm.html", "events", start, confirmData{Action: "replay", What: fmt.Sprintf("event #%d (%s, %s)", ev.Seq, ev.EventType, ev.ID),
			Count: 1, Path: path + "/replay", Cancel: path, Fields: r.PostForm})
		return
	}
	n, err := c.store.Replay(r.Context(), dialect.ReplayFilter{FromSeq: ev.Seq, ToSeq: ev.Seq})
	if err != nil {
		c.fail(w, err)
		return
	}
	c.log.Info("txoutbox: console: action", "user", user, "action", "replay", "seq", ev.Seq, "event_id", ev.ID, "events", n)
	http.Redirect(w, r, c.opts.Prefix+path+"?flash="+url.QueryEscape(fmt.Sprintf("replayed %d event: pending again, the relay publishes it once more under its ID", n)), http.StatusSeeOther)
}
