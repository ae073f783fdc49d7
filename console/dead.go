package console

import (
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

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
