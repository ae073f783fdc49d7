package console

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
	"github.com/txoutbox/txoutbox/ordered"
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
	p := page{Title: c.opts.Title, Nav: nav, Base: c.opts.Prefix, HasInbox: c.opts.Inbox != nil, HasLog: c.opts.Slot != nil, ReadOnly: c.opts.ReadOnly, CSRF: c.csrfToken(c.user(r)),
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

// sample is one point of the overview's charts.
type sample struct {
	At        time.Time
	Pending   int64
	OldestAge time.Duration
	Dead      int64
	// Published is the events published since the previous sample.
	Published int64
	// Rate is Published per second since the previous sample.
	Rate float64
}

// maxSamples bounds the charts: an hour at the default interval.
const maxSamples = 720

// sample reads the stats and the events published since the previous
// sample, and keeps the point.
func (c *Console) sample(ctx context.Context) (core.Stats, error) {
	s, err := c.store.Stats(ctx)
	if err != nil {
		return s, err
	}
	now := time.Now()
	c.mu.Lock()
	var prev time.Time
	if n := len(c.samples); n > 0 {
		prev = c.samples[n-1].At
	}
	c.mu.Unlock()
	pt := sample{At: now, Pending: s.Pending, OldestAge: s.OldestPendingAge, Dead: s.Dead}
	if !prev.IsZero() {
		n, err := c.store.CountPublishedSince(ctx, prev)
		if err != nil {
			return s, err
		}
		pt.Published = n
		if el := now.Sub(prev).Seconds(); el > 0 {
			pt.Rate = float64(n) / el
		}
	}
	c.mu.Lock()
	c.samples = append(c.samples, pt)
	if len(c.samples) > maxSamples {
		c.samples = slices.Delete(c.samples, 0, len(c.samples)-maxSamples)
	}
	c.mu.Unlock()
	return s, nil
}

type typeRow struct {
	Type             string
	Pending, Dead    int64
	OldestPendingAge time.Duration
}

type overviewData struct {
	Stats             core.Stats
	Types             []typeRow
	Rows              int64
	RowsEstimated     bool
	Lagging           bool
	LagThreshold      time.Duration
	Samples           int
	PendingChart      template.HTML
	AgeChart          template.HTML
	RateChart         template.HTML
	LastRate          float64
	SampleInterval    time.Duration
	DeadGroups        int
	PublishedEstimate int64
	// Relays is the relays holding live partition leases (ordered mode),
	// -1 when the console was given no Leases.
	Relays int
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	s, err := c.sample(r.Context())
	if err != nil {
		c.fail(w, err)
		return
	}
	rows, est, err := c.store.EstimateRows(r.Context())
	if err != nil {
		c.fail(w, err)
		return
	}
	d := overviewData{Stats: s, Rows: rows, RowsEstimated: est, LagThreshold: c.opts.LagThreshold,
		Lagging: s.Pending > 0 && s.OldestPendingAge > c.opts.LagThreshold, SampleInterval: c.opts.SampleInterval}
	d.PublishedEstimate = max(rows-s.Pending-s.Dead, 0)
	d.Relays = -1
	if c.opts.Leases != nil {
		ls, err := c.opts.Leases.Leases(r.Context())
		if err != nil {
			c.fail(w, err)
			return
		}
		d.Relays = len(liveOwners(ls))
	}
	for name, ts := range s.ByType {
		d.Types = append(d.Types, typeRow{Type: name, Pending: ts.Pending, Dead: ts.Dead, OldestPendingAge: ts.OldestPendingAge})
	}
	slices.SortFunc(d.Types, func(a, b typeRow) int { return strings.Compare(a.Type, b.Type) })
	c.mu.Lock()
	pts := slices.Clone(c.samples)
	c.mu.Unlock()
	d.Samples = len(pts)
	pending := make([]float64, len(pts))
	ages := make([]float64, len(pts))
	rate := make([]float64, 0, len(pts))
	for i, p := range pts {
		pending[i] = float64(p.Pending)
		ages[i] = p.OldestAge.Seconds()
		if i > 0 {
			rate = append(rate, p.Rate)
		}
	}
	if len(rate) > 0 {
		d.LastRate = rate[len(rate)-1]
	}
	d.PendingChart = sparkline(pending, "pending events")
	d.RateChart = sparkline(rate, "events published per second")
	d.AgeChart = sparkline(ages, "oldest pending age, seconds")
	c.render(w, r, "overview.html", "overview", start, d)
}

// errorNoise is what varies between two occurrences of one error: UUIDs,
// hexadecimal IDs, numbers, quoted values and addresses.
var errorNoise = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`), "<id>"},
	{regexp.MustCompile(`\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b`), "<addr>"},
	{regexp.MustCompile(`"[^"]*"|'[^']*'`), "<q>"},
	{regexp.MustCompile(`\b0x[0-9a-fA-F]+\b|\b[0-9a-fA-F]{16,}\b`), "<hex>"},
	{regexp.MustCompile(`\d+(?:\.\d+)?`), "<n>"},
}

// normalizeError turns a last_error into its group's key: what varies from
// one occurrence to the next replaced by a placeholder.
func normalizeError(s string) string {
	for _, n := range errorNoise {
		s = n.re.ReplaceAllString(s, n.with)
	}
	return s
}

// deadWindow is how many of the latest dead letters the grouped page
// reads: enough for every group that matters now, and a bound on the
// page's cost when dead letters pile up (100k in 150-350 ms otherwise).
// Retry and purge of a group act on all its dead letters, whatever their
// age.
const deadWindow = 10_000

// group is the dead letters of one event type and normalised error.
type group struct {
	EventType, Error    string
	Count               int64
	FirstDead, LastDead time.Time
	// Errors are the raw last errors of the group (for retry and purge).
	Errors []string
}

// Key identifies the group in the console's links and forms: opaque and
// safe in HTML and URLs, whatever the type and the error hold.
func (g group) Key() string { return groupKey(g.EventType, g.Error) }

func groupKey(eventType, normError string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(eventType + "\x00" + normError))
}

// groups merges the store's dead groups by normalised error.
func (c *Console) groups(ctx context.Context) ([]group, error) {
	raw, err := c.store.DeadGroups(ctx, deadWindow, 5000)
	if err != nil {
		return nil, err
	}
	byKey := map[string]*group{}
	var out []*group
	for _, g := range raw {
		k := groupKey(g.EventType, normalizeError(g.LastError))
		m := byKey[k]
		if m == nil {
			m = &group{EventType: g.EventType, Error: normalizeError(g.LastError), FirstDead: g.FirstDead, LastDead: g.LastDead}
			byKey[k] = m
			out = append(out, m)
		}
		m.Count += g.Count
		m.Errors = append(m.Errors, g.LastError)
		if g.FirstDead.Before(m.FirstDead) {
			m.FirstDead = g.FirstDead
		}
		if g.LastDead.After(m.LastDead) {
			m.LastDead = g.LastDead
		}
	}
	slices.SortStableFunc(out, func(a, b *group) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.Key(), b.Key())
	})
	gs := make([]group, len(out))
	for i, g := range out {
		gs[i] = *g
	}
	return gs, nil
}

func (c *Console) deadGroups(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	gs, err := c.groups(r.Context())
	if err != nil {
		c.fail(w, err)
		return
	}
	var total int64
	for _, g := range gs {
		total += g.Count
	}
	c.render(w, r, "dead.html", "dead", start, struct {
		Groups []group
		Total  int64
		Window int64
	}{gs, total, deadWindow})
}

// findGroup returns the group of key, without its count and dates: the
// event type and the normalised error the key holds.
func (c *Console) findGroup(_ context.Context, key string) (group, error) {
	b, err := base64.RawURLEncoding.DecodeString(key)
	typ, norm, ok := strings.Cut(string(b), "\x00")
	if err != nil || !ok || typ == "" {
		return group{}, fmt.Errorf("%w: dead-letter group %q", errBadInput, key)
	}
	return group{EventType: typ, Error: norm}, nil
}

// groupSeqs returns the Seqs of the dead events of g, walking the dead
// events of its type page by page.
func (c *Console) groupSeqs(ctx context.Context, g group) ([]int64, error) {
	var seqs []int64
	p := dialect.Page{Limit: 1000}
	for {
		evs, err := c.store.ListDead(ctx, dialect.DeadFilter{EventType: g.EventType}, p)
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			if normalizeError(ev.LastError) == g.Error {
				seqs = append(seqs, ev.Seq)
			}
		}
		if len(evs) < p.Limit {
			return seqs, nil
		}
		p.AfterSeq = evs[len(evs)-1].Seq
	}
}

func (c *Console) deadEvents(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	key := r.URL.Query().Get("group")
	g, err := c.findGroup(r.Context(), key)
	if err != nil {
		c.fail(w, err)
		return
	}
	after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
	var evs []core.Event
	p := dialect.Page{AfterSeq: after, Limit: 200}
	for len(evs) < 50 {
		page, err := c.store.ListDead(r.Context(), dialect.DeadFilter{EventType: g.EventType}, p)
		if err != nil {
			c.fail(w, err)
			return
		}
		for _, ev := range page {
			if normalizeError(ev.LastError) == g.Error && len(evs) < 50 {
				evs = append(evs, ev)
			}
		}
		if len(page) < p.Limit {
			break
		}
		p.AfterSeq = page[len(page)-1].Seq
	}
	next := int64(0)
	if len(evs) == 50 {
		next = evs[len(evs)-1].Seq
	}
	c.render(w, r, "deadevents.html", "dead", start, struct {
		Group  group
		Events []core.Event
		Next   int64
	}{g, evs, next})
}

// confirmData is the confirmation page of an action.
type confirmData struct {
	Action, What string
	Count        int
	Path, Cancel string
	Fields       map[string][]string
}

// deadAction retries or purges a group, or the selected events, of dead
// letters. Without confirm=yes it shows how many events it would touch
// and asks.
func (c *Console) deadAction(w http.ResponseWriter, r *http.Request, user string) {
	start := time.Now()
	ctx := r.Context()
	act := r.PostForm.Get("action")
	if act != "retry" && act != "purge" {
		c.fail(w, fmt.Errorf("%w: action %q (want retry or purge)", errBadInput, act))
		return
	}
	var seqs []int64
	var what string
	if key := r.PostForm.Get("group"); key != "" {
		g, err := c.findGroup(ctx, key)
		if err != nil {
			c.fail(w, err)
			return
		}
		if seqs, err = c.groupSeqs(ctx, g); err != nil {
			c.fail(w, err)
			return
		}
		what = fmt.Sprintf("the dead letters of %s failing with %q", g.EventType, g.Error)
	} else {
		for _, s := range r.PostForm["seq"] {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n <= 0 {
				c.fail(w, fmt.Errorf("%w: seq %q", errBadInput, s))
				return
			}
			seqs = append(seqs, n)
		}
		what = "the selected dead letters"
	}
	if len(seqs) == 0 {
		c.fail(w, fmt.Errorf("%w: nothing selected", errBadInput))
		return
	}
	if r.PostForm.Get("confirm") != "yes" {
		c.render(w, r, "confirm.html", "dead", start, confirmData{Action: act, What: what, Count: len(seqs), Path: "/dead/action", Cancel: "/dead", Fields: r.PostForm})
		return
	}
	var n int64
	for chunk := range slices.Chunk(seqs, 1000) {
		f := dialect.DeadFilter{Seqs: chunk}
		var k int64
		var err error
		if act == "retry" {
			k, err = c.store.RetryDead(ctx, f)
		} else {
			k, err = c.store.PurgeDead(ctx, f)
		}
		n += k
		if err != nil {
			c.log.Error("txoutbox: console: action failed", "user", user, "action", act+" dead", "what", what, "done", n, "error", err)
			c.fail(w, err)
			return
		}
	}
	c.log.Info("txoutbox: console: action", "user", user, "action", act+" dead", "what", what, "events", n)
	verb := map[string]string{"retry": "re-queued", "purge": "purged"}[act]
	http.Redirect(w, r, c.opts.Prefix+"/dead?flash="+url.QueryEscape(fmt.Sprintf("%s %d events: %s", verb, n, what)), http.StatusSeeOther)
}

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

// liveOwners counts the live leases of each relay.
func liveOwners(ls []ordered.Lease) map[string]int {
	owners := map[string]int{}
	for _, l := range ls {
		if l.Live && l.Owner != "" {
			owners[l.Owner]++
		}
	}
	return owners
}

type relayRow struct {
	Owner      string
	Partitions int
}

type orderedData struct {
	Held       []dialect.HeldAggregate
	HasLeases  bool
	Partitions int
	Free       int
	Relays     []relayRow
	Leases     []ordered.Lease
}

// ordered shows what ordered mode holds back and why, and, with Leases,
// which relay holds which partition.
func (c *Console) orderedPage(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	held, err := c.store.HeldAggregates(r.Context(), 200)
	if err != nil {
		c.fail(w, err)
		return
	}
	d := orderedData{Held: held}
	if c.opts.Leases != nil {
		ls, err := c.opts.Leases.Leases(r.Context())
		if err != nil {
			c.fail(w, err)
			return
		}
		d.HasLeases, d.Partitions, d.Leases = true, c.opts.Leases.PartitionCount(), ls
		for owner, n := range liveOwners(ls) {
			d.Relays = append(d.Relays, relayRow{owner, n})
		}
		slices.SortFunc(d.Relays, func(a, b relayRow) int { return strings.Compare(a.Owner, b.Owner) })
		for _, l := range ls {
			if !l.Live {
				d.Free++
			}
		}
	}
	c.render(w, r, "ordered.html", "ordered", start, d)
}

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
