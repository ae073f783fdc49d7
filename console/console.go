// Package console serves the operations console of an outbox: a web page
// for the backlog, the dead letters and the events, with the actions an
// on-call engineer takes (retry or purge dead letters, replay an event).
//
// A Console is an http.Handler: mount it under your own router and your
// own authentication (http.StripPrefix), or let `txoutbox console` serve
// it. It reads and acts through the store's methods (Store), so it works
// on every database the SQL stores support, with no SQL of its own.
//
// Safe by default: every action is a POST that passes Go's cross-origin
// protection (http.CrossOriginProtection) and carries a CSRF token tied to
// the console and the user; destructive actions show the count they would
// touch and ask for confirmation first; ReadOnly hides and refuses them;
// every action is logged with who did what. The console shows no DSN and
// no secret; payloads sealed by package seal stay sealed.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/txoutbox/txoutbox/binlogrelay"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
	"github.com/txoutbox/txoutbox/logrelay"
	"github.com/txoutbox/txoutbox/ordered"
)

// Store is what the console needs of an outbox store. sqlxoutbox.Outbox
// (and so the GORM store) and pgxoutbox.Outbox implement it.
type Store interface {
	Stats(ctx context.Context) (core.Stats, error)
	DeadGroups(ctx context.Context, window, limit int) ([]dialect.DeadGroup, error)
	ListDead(ctx context.Context, f dialect.DeadFilter, p dialect.Page) ([]core.Event, error)
	RetryDead(ctx context.Context, f dialect.DeadFilter) (int64, error)
	PurgeDead(ctx context.Context, f dialect.DeadFilter) (int64, error)
	ListEvents(ctx context.Context, f dialect.EventFilter, p dialect.EventPage) ([]core.Event, error)
	Get(ctx context.Context, eventID string) (core.Event, error)
	GetBySeq(ctx context.Context, seq int64) (core.Event, error)
	Replay(ctx context.Context, f dialect.ReplayFilter) (int64, error)
	CountPublishedSince(ctx context.Context, since time.Time) (int64, error)
	EstimateRows(ctx context.Context) (int64, bool, error)
	HeldAggregates(ctx context.Context, limit int) ([]dialect.HeldAggregate, error)
}

// Leases lists ordered mode's partition leases; *ordered.Leaser is one.
type Leases interface {
	Leases(ctx context.Context) ([]ordered.Lease, error)
	PartitionCount() int
}

// InboxReader reads a consumers' inbox; *sqlinbox.Inbox is one.
type InboxReader interface {
	Consumers(ctx context.Context) ([]sqlinbox.ConsumerStats, error)
	ProcessedBy(ctx context.Context, eventID string) (map[string]time.Time, error)
}

// Options configures a Console. Zero fields take their defaults.
type Options struct {
	// Prefix is the path the console is mounted under, without a trailing
	// slash ("/ops/outbox"), for its links: mount it with
	// http.StripPrefix(prefix, console). Default "" (the root).
	Prefix string
	// Title names the outbox on every page (e.g. "orders (production)").
	// Default "outbox".
	Title string
	// ReadOnly hides the actions and refuses them.
	ReadOnly bool
	// Token, when set, is required of every request: as a bearer token
	// (Authorization: Bearer ...), or once as ?token=... in a browser,
	// which then keeps it in a cookie.
	Token string
	// BasicAuth, when set ("user:password"), is required of every request
	// as HTTP basic authentication.
	BasicAuth string
	// User tells who makes a request, for the action log, when the console
	// is mounted behind the application's own authentication. Default: the
	// basic-auth user, "token" with a token, else the remote address.
	User func(r *http.Request) string
	// Leases, when set, shows ordered mode's partitions and which relay
	// holds each, and the relays alive on the overview.
	Leases Leases
	// Inbox, when set, adds the inbox page: records per consumer, and an
	// event looked up across consumers.
	Inbox InboxReader
	// Slot, when set, adds log mode's page: the replication slot's state
	// (logrelay.Status).
	Slot func(ctx context.Context) (logrelay.SlotStatus, error)
	// Binlog, when set, adds log mode's page on MySQL and MariaDB: the
	// stream's binlog position against the server's (binlogrelay.ReadStatus).
	Binlog func(ctx context.Context) (binlogrelay.Status, error)
	// LagThreshold is the oldest pending age above which the overview
	// shows the outbox as lagging. Default 1m.
	LagThreshold time.Duration
	// SampleInterval is how often Run samples the backlog and the publish
	// rate for the overview's charts. Default 5s.
	SampleInterval time.Duration
	// Logger receives one line per action (who, what, how many). Default
	// slog.Default().
	Logger *slog.Logger
}

// Console is the operations console of one outbox. It is safe for
// concurrent use.
type Console struct {
	store   Store
	opts    Options
	log     *slog.Logger
	secret  []byte // keys the CSRF tokens of this process
	tmpl    *template.Template
	handler http.Handler

	mu      sync.Mutex
	samples []sample // oldest first, at most maxSamples
}

//go:embed templates/*.html static/*
var assets embed.FS

// New returns the console of store.
func New(store Store, opts Options) (*Console, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: console.New needs a store", core.ErrInvalidOptions)
	}
	if opts.BasicAuth != "" && !strings.Contains(opts.BasicAuth, ":") {
		return nil, fmt.Errorf("%w: console BasicAuth wants user:password", core.ErrInvalidOptions)
	}
	if opts.LagThreshold < 0 || opts.SampleInterval < 0 {
		return nil, fmt.Errorf("%w: console: negative LagThreshold or SampleInterval", core.ErrInvalidOptions)
	}
	if opts.Title == "" {
		opts.Title = "outbox"
	}
	opts.Prefix = strings.TrimSuffix(opts.Prefix, "/")
	if opts.Prefix != "" && !strings.HasPrefix(opts.Prefix, "/") {
		return nil, fmt.Errorf("%w: console Prefix %q must start with /", core.ErrInvalidOptions, opts.Prefix)
	}
	if opts.LagThreshold == 0 {
		opts.LagThreshold = time.Minute
	}
	if opts.SampleInterval == 0 {
		opts.SampleInterval = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	tmpl, err := template.New("").Funcs(funcs).ParseFS(assets, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("console: templates: %w", err)
	}
	c := &Console{store: store, opts: opts, log: opts.Logger, secret: secret, tmpl: tmpl}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", c.overview)
	mux.HandleFunc("GET /dead", c.deadGroups)
	mux.HandleFunc("GET /dead/events", c.deadEvents)
	mux.HandleFunc("POST /dead/action", c.action(c.deadAction))
	mux.HandleFunc("GET /events", c.events)
	mux.HandleFunc("GET /events/{seq}", c.event)
	mux.HandleFunc("GET /ordered", c.orderedPage)
	if opts.Inbox != nil {
		mux.HandleFunc("GET /inbox", c.inboxPage)
	}
	switch {
	case opts.Slot != nil:
		mux.HandleFunc("GET /log", c.logMode)
	case opts.Binlog != nil:
		mux.HandleFunc("GET /log", c.binlogMode)
	}
	mux.HandleFunc("POST /events/{seq}/replay", c.action(c.replayAction))
	// Actions are POSTs from this console's own pages: a cross-site POST
	// (a link or form on another site, in the user's browser) is refused
	// before the handler runs.
	c.handler = c.authenticate(http.NewCrossOriginProtection().Handler(mux))
	return c, nil
}

// ServeHTTP serves the console's pages.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	c.handler.ServeHTTP(w, r)
}

// Protect wraps h with the console's authentication (Token, BasicAuth),
// for pages served beside the console, such as an index of several
// consoles. Without either option h is returned as it is.
func (c *Console) Protect(h http.Handler) http.Handler { return c.authenticateAt(h, "") }

// Run samples the backlog and the publish rate every SampleInterval for
// the overview's charts, until ctx ends. Without it the charts show what
// page loads sampled.
func (c *Console) Run(ctx context.Context) error {
	t := time.NewTicker(c.opts.SampleInterval)
	defer t.Stop()
	for {
		if _, err := c.sample(ctx); err != nil && ctx.Err() == nil {
			c.log.Debug("txoutbox: console: sample failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// authenticate requires the token or basic auth when configured, of the
// console's own pages.
func (c *Console) authenticate(next http.Handler) http.Handler {
	return c.authenticateAt(next, c.opts.Prefix)
}

// authenticateAt is authenticate for a handler that sees its request's
// path after prefix was stripped from it.
func (c *Console) authenticateAt(next http.Handler, prefix string) http.Handler {
	if c.opts.Token == "" && c.opts.BasicAuth == "" {
		return next
	}
	const cookie = "txoutbox_console"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.opts.BasicAuth != "" {
			u, p, ok := r.BasicAuth()
			if ok && subtle.ConstantTimeCompare([]byte(u+":"+p), []byte(c.opts.BasicAuth)) == 1 {
				next.ServeHTTP(w, r)
				return
			}
			if c.opts.Token == "" {
				w.Header().Set("WWW-Authenticate", `Basic realm="txoutbox console", charset="UTF-8"`)
				http.Error(w, "authentication required", http.StatusUnauthorized)
				return
			}
		}
		if c.opts.Token != "" {
			got := ""
			if h := r.Header.Get("Authorization"); strings.HasPrefix(h, "Bearer ") {
				got = strings.TrimPrefix(h, "Bearer ")
			} else if ck, err := r.Cookie(cookie); err == nil {
				got = ck.Value
			} else if q := r.URL.Query().Get("token"); q != "" && r.Method == http.MethodGet {
				if subtle.ConstantTimeCompare([]byte(q), []byte(c.opts.Token)) == 1 {
					// Keep it in a cookie and take it out of the URL (and so
					// out of the history and of logs).
					http.SetCookie(w, &http.Cookie{Name: cookie, Value: q, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
					u := *r.URL
					qs := u.Query()
					qs.Del("token")
					u.RawQuery = qs.Encode()
					http.Redirect(w, r, prefix+u.RequestURI(), http.StatusSeeOther)
					return
				}
			}
			if got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(c.opts.Token)) == 1 {
				next.ServeHTTP(w, r)
				return
			}
		}
		http.Error(w, "authentication required: open the console with ?token=... (or send Authorization: Bearer ...)", http.StatusUnauthorized)
	})
}

// user tells who makes r, for the action log.
func (c *Console) user(r *http.Request) string {
	if c.opts.User != nil {
		if u := c.opts.User(r); u != "" {
			return u
		}
	}
	if u, _, ok := r.BasicAuth(); ok {
		return u
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if c.opts.Token != "" {
		return "token@" + host
	}
	return host
}

// csrfToken is the token the console's forms carry for user: an HMAC of the
// user under this process's secret. A page of another site cannot read it.
func (c *Console) csrfToken(user string) string {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte("txoutbox-console-csrf\x00" + user))
	return hex.EncodeToString(m.Sum(nil))
}

// action wraps a POST handler: refused in read-only mode and without the
// form's CSRF token.
func (c *Console) action(h func(w http.ResponseWriter, r *http.Request, user string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.opts.ReadOnly {
			http.Error(w, "the console is read-only", http.StatusForbidden)
			return
		}
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form: "+err.Error(), http.StatusBadRequest)
			return
		}
		user := c.user(r)
		want := c.csrfToken(user)
		if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(want)) != 1 {
			c.log.Warn("txoutbox: console: action refused: missing or wrong CSRF token", "user", user, "path", r.URL.Path)
			http.Error(w, "missing or wrong CSRF token: reload the page and try again", http.StatusForbidden)
			return
		}
		h(w, r, user)
	}
}
