package console_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/console"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/logrelay"
	"github.com/txoutbox/txoutbox/ordered"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

var quiet = slog.New(slog.DiscardHandler)

// outbox is a fresh PostgreSQL outbox holding generated events: published
// ones of three types, pending ones, and two groups of dead ones whose
// errors differ only in an ID.
type outbox struct {
	dsn string
	db  *sql.DB
	box *sqlxoutbox.Outbox
}

const (
	groupA = "order.paid"    // dead: "broker refused event <uuid>: 403"
	groupB = "order.shipped" // dead: "payload too large (<n> bytes)"
)

func newOutbox(t *testing.T) *outbox {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	db := testenv.OpenPostgresDSN(t, dsn)
	ctx := t.Context()
	if err := dialect.Migrate(ctx, db, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	box, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	o := &outbox{dsn: dsn, db: db, box: box}
	o.exec(t, `INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, payload, published_at, attempt_count)
		SELECT gen_random_uuid(), 'order', 'o-' || g, (ARRAY['order.created','order.paid','order.shipped'])[1 + g % 3],
		       jsonb_build_object('order_id', 'o-' || g, 'total_cents', g * 7), now() - (g || ' seconds')::interval, 1
		FROM generate_series(1, 300) g`)
	o.exec(t, `INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, payload, created_at, next_attempt_at)
		SELECT gen_random_uuid(), 'order', 'p-' || g, 'order.created', '{"pending": true}', now() - interval '5 minutes', now() - interval '5 minutes'
		FROM generate_series(1, 7) g`)
	// Reminders scheduled for tomorrow: counted apart, not lag.
	o.exec(t, `INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, payload, next_attempt_at)
		SELECT gen_random_uuid(), 'order', 's-' || g, 'order.reminder', '{"scheduled": true}', now() + interval '1 day'
		FROM generate_series(1, 4) g`)
	o.exec(t, `INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, payload, attempt_count, last_error, dead_at)
		SELECT gen_random_uuid(), 'order', 'd-' || g, '`+groupA+`', '{"dead": true}', 5, 'broker refused event ' || gen_random_uuid() || ': 403', now() - (g || ' minutes')::interval
		FROM generate_series(1, 12) g`)
	o.exec(t, `INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, payload, attempt_count, last_error, dead_at)
		SELECT gen_random_uuid(), 'order', 'e-' || g, '`+groupB+`', '{"dead": true}', 1, 'payload too large (' || (300000 + g) || ' bytes)', now()
		FROM generate_series(1, 5) g`)
	o.exec(t, "ANALYZE outbox_events")
	return o
}

func (o *outbox) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := o.db.ExecContext(t.Context(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func (o *outbox) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	if err := o.db.QueryRowContext(t.Context(), "SELECT count(*) FROM outbox_events WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// browser is a headless Chromium tab that records the page's console
// errors, warnings and exceptions, and saves screenshots.
type browser struct {
	ctx       context.Context
	mu        sync.Mutex
	errs      []string
	artifacts string
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := testenv.Env(t, "TXOUTBOX_CHROMIUM")
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelC()
		cancelA()
	})
	b := &browser{ctx: ctx, artifacts: os.Getenv("TXOUTBOX_ARTIFACTS")}
	if b.artifacts == "" {
		b.artifacts = t.TempDir()
	}
	// The first run starts the browser, with no timeout of its own.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start Chromium (%s): %v", path, err)
	}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning || m.IsException() {
				b.mu.Lock()
				b.errs = append(b.errs, m.String()+" at "+m.URL)
				b.mu.Unlock()
			}
		}
	}()
	return b
}

func (b *browser) run(t *testing.T, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

func get[T any](t *testing.T, b *browser, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	png := get(t, b, chromedp.FullScreenshot(100))
	path := filepath.Join(b.artifacts, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", path)
}

func (b *browser) noErrors(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.errs) > 0 {
		t.Errorf("the pages logged %d errors or warnings:\n%s", len(b.errs), strings.Join(b.errs, "\n"))
	}
}

func text(t *testing.T, b *browser, sel string) string {
	t.Helper()
	return strings.TrimSpace(get(t, b, chromedp.Text(chromedp.CSS(sel))))
}

// The console in a real Chromium against real PostgreSQL: every page
// shows the database's numbers; retrying a dead-letter group through the
// UI makes its events pending, and a relay publishes them; purging asks
// first; no page logs an error.
func TestConsoleInChromium(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	c, err := console.New(o.box, console.Options{Title: "orders (test)", Logger: quiet, LagThreshold: time.Minute, SampleInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	b := newBrowser(t)
	sctx, stopSampling := context.WithCancel(context.Background())
	defer stopSampling()
	go func() { _ = c.Run(sctx) }()

	// Overview.
	b.run(t, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#pending")))
	if got, want := text(t, b, "#pending"), strconv.Itoa(o.count(t, "published_at IS NULL AND dead_at IS NULL AND next_attempt_at <= now()")); got != want {
		t.Errorf("overview pending = %s, the database has %s", got, want)
	}
	if got, want := text(t, b, "#dead"), strconv.Itoa(o.count(t, "dead_at IS NOT NULL")); got != want {
		t.Errorf("overview dead = %s, the database has %s", got, want)
	}
	if got, want := text(t, b, "#scheduled"), strconv.Itoa(o.count(t, "attempt_count = 0 AND next_attempt_at > now()")); got != want || got == "0" {
		t.Errorf("overview scheduled = %s, the database has %s", got, want)
	}
	if got := text(t, b, "#lag-state"); !strings.HasPrefix(got, "lagging") {
		t.Errorf("the oldest pending event waited 5 minutes against a 1m threshold; the page says %q", got)
	}
	if got := text(t, b, "#published"); !strings.HasPrefix(got, "~") {
		t.Errorf("published shows %q: want an estimate, marked ~", got)
	}
	typeRows := get(t, b, chromedp.Evaluate[int](`document.querySelectorAll("#types tbody tr").length`))
	if typeRows != 4 {
		t.Errorf("overview lists %d event types, want 4 (created pending; paid and shipped dead; reminder scheduled)", typeRows)
	}
	b.screenshot(t, "overview")

	// Dead letters: two groups, the IDs in the errors normalised away.
	b.run(t, chromedp.Navigate(srv.URL+"/dead"), chromedp.WaitVisible(chromedp.CSS("#groups")))
	groups := get(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#groups tbody tr")].map(r => r.dataset.type + " " + r.cells[2].innerText)`))
	if strings.Join(groups, ",") != groupA+" 12,"+groupB+" 5" {
		t.Fatalf("dead-letter groups %q, want %s 12 and %s 5", groups, groupA, groupB)
	}
	b.screenshot(t, "dead-letters")

	// Purge asks first, and nothing is purged until confirmed.
	b.run(t, chromedp.Click(chromedp.CSS(`#groups tr[data-type="`+groupB+`"] button[value=purge]`)), chromedp.WaitVisible(chromedp.CSS("#confirm")))
	if got := text(t, b, "#confirm-what"); !strings.Contains(got, "purge 5 events") || !strings.Contains(got, "cannot be recovered") {
		t.Errorf("purge confirmation says %q", got)
	}
	b.screenshot(t, "purge-confirmation")
	if n := o.count(t, "event_type = $1 AND dead_at IS NOT NULL", groupB); n != 5 {
		t.Fatalf("%d dead %s events after the purge was only asked for, want 5", n, groupB)
	}
	b.run(t, chromedp.Click(chromedp.CSS("#cancel")), chromedp.WaitVisible(chromedp.CSS("#groups")))

	// Retry the other group through the UI: pending in the database.
	b.run(t, chromedp.Click(chromedp.CSS(`#groups tr[data-type="`+groupA+`"] button[value=retry]`)), chromedp.WaitVisible(chromedp.CSS("#confirm")))
	if got := text(t, b, "#confirm-what"); !strings.Contains(got, "retry 12 events") {
		t.Errorf("retry confirmation says %q", got)
	}
	b.run(t, chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if got := text(t, b, "#flash"); !strings.Contains(got, "re-queued 12 events") {
		t.Errorf("after the retry the page says %q", got)
	}
	if n := o.count(t, "event_type = $1 AND dead_at IS NULL AND published_at IS NULL", groupA); n != 12 {
		t.Fatalf("%d %s events pending after the retry, want 12", n, groupA)
	}
	// ... and a relay publishes them.
	rec := outboxtest.NewRecorder()
	relay, err := core.NewRelay(o.box, rec, core.RelayOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	paid := 0
	for _, ev := range rec.Events() {
		if ev.EventType == groupA {
			paid++
		}
	}
	if paid != 12 {
		t.Errorf("the relay published %d of the 12 retried %s events", paid, groupA)
	}

	// Events: search, then the detail of one.
	b.run(t, chromedp.Navigate(srv.URL+"/events?type=order.created&state=published"), chromedp.WaitVisible(chromedp.CSS("#events")))
	rows := get(t, b, chromedp.Evaluate[int](`document.querySelectorAll("#events tbody tr").length`))
	published := o.count(t, "event_type = 'order.created' AND published_at IS NOT NULL")
	if rows != min(published, 50) || published <= 50 {
		t.Errorf("events search for published order.created lists %d rows; the database has %d (a page is 50)", rows, published)
	}
	b.run(t, chromedp.Click(chromedp.CSS("#next")), chromedp.WaitVisible(chromedp.CSS("#events")))
	if rows2 := get(t, b, chromedp.Evaluate[int](`document.querySelectorAll("#events tbody tr").length`)); rows2 != min(published-50, 50) {
		t.Errorf("the second page lists %d rows, want %d", rows2, min(published-50, 50))
	}
	b.screenshot(t, "events")
	var seq int64
	if err := o.db.QueryRowContext(t.Context(), "SELECT max(id) FROM outbox_events WHERE published_at IS NOT NULL").Scan(&seq); err != nil {
		t.Fatal(err)
	}
	b.run(t, chromedp.Navigate(fmt.Sprintf("%s/events/%d", srv.URL, seq)), chromedp.WaitVisible(chromedp.CSS("#payload")))
	ev, err := o.box.GetBySeq(t.Context(), seq)
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, "#event-id"); got != ev.ID {
		t.Errorf("event page shows ID %q, want %q", got, ev.ID)
	}
	var shown, stored any
	if err := json.Unmarshal([]byte(text(t, b, "#payload")), &shown); err != nil {
		t.Fatalf("the payload shown is not JSON: %v", err)
	}
	if err := json.Unmarshal(ev.Payload, &stored); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(shown, stored) {
		t.Errorf("payload shown %v, stored %v", shown, stored)
	}
	b.screenshot(t, "event")
	b.run(t, chromedp.Click(chromedp.CSS("#replay")), chromedp.WaitVisible(chromedp.CSS("#confirm")),
		chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if got := text(t, b, "#state"); got != "pending" {
		t.Errorf("after the replay the event is %q, want pending", got)
	}
	// The overview again, its charts drawn from the samples of the run.
	b.run(t, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("svg.chart")))
	b.screenshot(t, "overview-charts")
	b.noErrors(t)
}

// Authentication and CSRF: requests without the token are refused, a
// browser's ?token= sets a cookie, and an action without the form's token,
// or from another site, is refused before anything is written.
func TestConsoleRefusals(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	c, err := console.New(o.box, console.Options{Token: "s3cret", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string, hdr map[string]string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if r := get("/", nil); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET / without the token: %d, want 401", r.StatusCode)
	}
	if r := get("/", map[string]string{"Authorization": "Bearer wrong"}); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET / with a wrong token: %d, want 401", r.StatusCode)
	}
	if r := get("/", map[string]string{"Authorization": "Bearer s3cret"}); r.StatusCode != http.StatusOK {
		t.Errorf("GET / with the token: %d, want 200", r.StatusCode)
	}
	r := get("/dead?token=s3cret", nil)
	if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/dead" || len(r.Cookies()) != 1 || !r.Cookies()[0].HttpOnly {
		t.Errorf("?token=: %d to %q with cookies %v; want a redirect to /dead setting an HttpOnly cookie", r.StatusCode, r.Header.Get("Location"), r.Cookies())
	}

	post := func(form url.Values, hdr map[string]string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/dead/action", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "Bearer s3cret")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	key := console.GroupKey(groupB, "payload too large (<n> bytes)")
	purge := url.Values{"action": {"purge"}, "group": {key}, "confirm": {"yes"}}
	if code := post(purge, nil); code != http.StatusForbidden {
		t.Errorf("purge without the CSRF token: %d, want 403", code)
	}
	withToken := url.Values{"action": {"purge"}, "group": {key}, "confirm": {"yes"}, "csrf": {csrfOf(t, srv.URL)}}
	if code := post(withToken, map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}); code != http.StatusForbidden {
		t.Errorf("purge from another site: %d, want 403", code)
	}
	if n := o.count(t, "dead_at IS NOT NULL"); n != 17 {
		t.Fatalf("%d dead events after the refused purges, want 17", n)
	}
	if code := post(withToken, nil); code != http.StatusSeeOther {
		t.Errorf("purge with the token from the console itself: %d, want 303", code)
	}
	if n := o.count(t, "dead_at IS NOT NULL"); n != 12 {
		t.Errorf("%d dead events after the purge of a group of 5, want 12", n)
	}

	ro, err := console.New(o.box, console.Options{ReadOnly: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	rsrv := httptest.NewServer(ro)
	defer rsrv.Close()
	resp, err := http.PostForm(rsrv.URL+"/dead/action", url.Values{"action": {"retry"}, "seq": {"1"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("an action on a read-only console: %d, want 403", resp.StatusCode)
	}
	if _, err := console.New(o.box, console.Options{BasicAuth: "nocolon"}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("BasicAuth without a colon: %v", err)
	}
}

// csrfOf reads the CSRF token of the console's forms, as its pages carry
// it.
func csrfOf(t *testing.T, base string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/dead", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	body := sb.String()
	i := strings.Index(body, `name="csrf" value="`)
	if i < 0 {
		t.Fatalf("no CSRF token on /dead:\n%s", body)
	}
	rest := body[i+len(`name="csrf" value="`):]
	return rest[:strings.IndexByte(rest, '"')]
}

// The ordered-mode, inbox and log-mode pages in Chromium, against what the
// database holds: held aggregates and why, the relays and their leases,
// the consumers' records and an event looked up across them, the slot.
func TestConsoleOperatorPages(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	ctx := t.Context()
	// The inbox, with two consumers.
	if err := dialect.Migrate(ctx, o.db, dialect.Postgres, dialect.MigrateOptions{SkipOutbox: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	in, err := sqlinbox.New(o.db, sqlinbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o.exec(t, `INSERT INTO processed_events (consumer, event_id) VALUES ('billing', 'e-1'), ('billing', 'e-2'), ('billing', 'e-3'), ('shipping', 'e-2')`)
	// A relay holding every partition.
	leaser, err := ordered.NewLeaser(o.db, dialect.Postgres, ordered.LeaserOptions{Owner: "relay-a", PartitionCount: 4, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	lctx, stopLeaser := context.WithCancel(ctx)
	defer stopLeaser()
	go func() { _ = leaser.Run(lctx) }()
	waitHeld := time.Now().Add(10 * time.Second)
	for len(leaser.Held()) < 4 && time.Now().Before(waitHeld) {
		time.Sleep(20 * time.Millisecond)
	}
	// Log mode's slot, which no relay streams.
	names := logrelay.Names{Slot: "console_" + strings.ToLower(testenv.RandomSuffix()), Publication: "console_test"}
	if err := logrelay.Setup(ctx, o.dsn, names); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = logrelay.Teardown(context.Background(), o.dsn, names, logrelay.TeardownOptions{Force: true})
	})
	c, err := console.New(o.box, console.Options{Logger: quiet, Leases: leaser, Inbox: in,
		Slot: func(ctx context.Context) (logrelay.SlotStatus, error) { return logrelay.StatusDB(ctx, o.db, names) }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	b := newBrowser(t)

	b.run(t, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#relays")))
	if got := text(t, b, "#relays"); got != "1" {
		t.Errorf("overview: relays alive %q, want 1", got)
	}
	b.run(t, chromedp.Navigate(srv.URL+"/ordered"), chromedp.WaitVisible(chromedp.CSS("#held")))
	held := get(t, b, chromedp.Evaluate[int](`document.querySelectorAll("#held tbody tr").length`))
	if want := o.count(t, "published_at IS NULL AND attempt_count > 0 AND aggregate_id <> ''"); held != want || want != 17 {
		t.Errorf("ordered page lists %d held aggregates; the database has %d failed unpublished aggregates (want 17)", held, want)
	}
	if got := text(t, b, "#held tbody tr td:nth-child(5)"); !strings.Contains(got, "dead event blocks it") {
		t.Errorf("why held: %q", got)
	}
	if got := text(t, b, "#relays tbody tr"); !strings.Contains(got, "relay-a") || !strings.HasSuffix(got, "4") {
		t.Errorf("relays: %q, want relay-a holding 4", got)
	}
	b.screenshot(t, "ordered")

	b.run(t, chromedp.Navigate(srv.URL+"/inbox?event_id=e-3"), chromedp.WaitVisible(chromedp.CSS("#lookup")))
	consumers := get(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#consumers tbody tr")].map(r => r.cells[0].innerText + " " + r.cells[1].innerText)`))
	if strings.Join(consumers, ",") != "billing 3,shipping 1" {
		t.Errorf("inbox consumers %q, want billing 3 and shipping 1", consumers)
	}
	lookup := get(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#lookup tbody tr")].map(r => r.cells[0].innerText + ": " + r.cells[1].innerText)`))
	if len(lookup) != 2 || !strings.HasPrefix(lookup[0], "billing: 2") || !strings.HasPrefix(lookup[1], "shipping: not processed") {
		t.Errorf("lookup of e-3: %q", lookup)
	}
	b.screenshot(t, "inbox")

	b.run(t, chromedp.Navigate(srv.URL+"/log"), chromedp.WaitVisible(chromedp.CSS("#slot-state")))
	if got := text(t, b, "#slot-state"); got != "no relay" {
		t.Errorf("log page: streaming %q, want \"no relay\"", got)
	}
	b.screenshot(t, "log-mode")
	b.noErrors(t)
}
