package main

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/binlogrelay"
	"github.com/txoutbox/txoutbox/console"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
	"github.com/txoutbox/txoutbox/logrelay"
	"github.com/txoutbox/txoutbox/ordered"
)

// consoleFlags are the flags of the console, in `txoutbox console` and in
// `txoutbox relay --console-addr`.
type consoleFlags struct {
	addr, token, basicAuth, title string
	readOnly                      bool
	inboxTable, slot, stream      string
}

func (f *consoleFlags) register(cmd *cobra.Command, addrFlag, addrDefault, addrHelp string) {
	fl := cmd.Flags()
	fl.StringVar(&f.addr, addrFlag, addrDefault, addrHelp)
	fl.StringVar(&f.token, "console-token", "", "require this token (open the console once with ?token=..., or send Authorization: Bearer ...); needed to listen beyond loopback")
	fl.StringVar(&f.basicAuth, "console-basic-auth", "", "require HTTP basic auth, user:password; needed to listen beyond loopback")
	fl.BoolVar(&f.readOnly, "console-read-only", false, "show, but offer and accept no action")
	fl.StringVar(&f.title, "console-title", "", "name of the outbox on every page (default: the table)")
	fl.StringVar(&f.inboxTable, "console-inbox-table", dialect.DefaultInboxTable, "the consumers' inbox table the console's inbox page reads, when it exists in this database")
	fl.StringVar(&f.slot, "console-slot", logrelay.DefaultSlot, "log mode's slot the console's log page reads, when the table is in log mode")
	fl.StringVar(&f.stream, "console-stream", binlogrelay.DefaultName, "MySQL/MariaDB: log mode's stream the console's log page reads, when the table is in log mode")
}

// isLoopback reports whether addr (host:port) listens on loopback only.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// check refuses a console reachable beyond loopback without auth.
func (f consoleFlags) check(addrFlag string) error {
	if f.basicAuth != "" && !strings.Contains(f.basicAuth, ":") {
		return usagef("--console-basic-auth wants user:password")
	}
	if f.addr != "" && !isLoopback(f.addr) && f.token == "" && f.basicAuth == "" {
		return usagef("--%s %s listens beyond loopback: set --console-token or --console-basic-auth (or put the console behind your own authentication, mounting package console)", addrFlag, f.addr)
	}
	return nil
}

// consoleExtras gives the console the pages this database has the tables
// for: ordered mode's leases, the inbox, log mode's slot.
func (a *app) consoleExtras(ctx context.Context, f consoleFlags, db *database, table string, ob *sqlxoutbox.Outbox, opts *console.Options) error {
	exists := func(table string) bool {
		id, err := dialect.ValidateIdentifier(table)
		if err != nil {
			return false
		}
		_, err = db.db.ExecContext(ctx, "SELECT 1 FROM "+db.dialect.Quote(id)+" WHERE 1 = 0")
		return err == nil
	}
	if db.dialect != dialect.SQLite && exists(dialect.DefaultLeaseTable) {
		l, err := ordered.NewLeaser(db.db, db.dialect, ordered.LeaserOptions{Table: table, Logger: a.log})
		if err != nil {
			return err
		}
		opts.Leases = l
	}
	if f.inboxTable != "" && exists(f.inboxTable) {
		in, err := sqlinbox.New(db.db, sqlinbox.Options{Dialect: db.dialect, Table: f.inboxTable})
		if err != nil {
			return err
		}
		opts.Inbox = in
	}
	if db.dialect == dialect.Postgres {
		var on bool
		if err := db.db.QueryRowContext(ctx, ob.Queries().LogMode()).Scan(&on); err != nil {
			return fmt.Errorf("console: %w", err)
		}
		if on {
			// Through the console's pool: the page opens no connection.
			names := logrelay.Names{Table: table, Slot: f.slot}
			opts.Slot = func(ctx context.Context) (logrelay.SlotStatus, error) { return logrelay.StatusDB(ctx, db.db, names) }
		}
	}
	if db.dialect == dialect.MySQL {
		names := binlogrelay.Names{Table: table, Name: f.stream}
		st, err := binlogrelay.ReadStatus(ctx, db.db, names)
		if err != nil {
			return fmt.Errorf("console: %w", err)
		}
		if st.Exists || st.DefaultSet {
			opts.Binlog = func(ctx context.Context) (binlogrelay.Status, error) {
				return binlogrelay.ReadStatus(ctx, db.db, names)
			}
		}
	}
	return nil
}

// serveConsole serves the console of ob on f.addr until ctx ends.
func (a *app) serveConsole(ctx context.Context, f consoleFlags, db *database, ob *sqlxoutbox.Outbox, lagThreshold time.Duration) (func(), error) {
	title := f.title
	if title == "" {
		title = a.table
	}
	opts := console.Options{Title: title, ReadOnly: f.readOnly, Token: f.token, BasicAuth: f.basicAuth,
		LagThreshold: lagThreshold, Logger: a.log}
	if err := a.consoleExtras(ctx, f, db, a.table, ob, &opts); err != nil {
		return nil, err
	}
	c, err := console.New(ob, opts)
	if err != nil {
		return nil, err
	}
	return a.serveConsoleHandler(ctx, f, c, c.Run)
}

// serveConsoleHandler serves h on f.addr, and runs each of runs (the
// consoles' samplers), until the returned stop is called or ctx ends.
func (a *app) serveConsoleHandler(ctx context.Context, f consoleFlags, h http.Handler, runs ...func(context.Context) error) (func(), error) {
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return nil, fmt.Errorf("console: listen on %s: %w", f.addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	cctx, cancel := context.WithCancel(ctx)
	for _, run := range runs {
		go func() { _ = run(cctx) }()
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("txoutbox: console: serve", "error", err)
		}
	}()
	auth := "none (loopback only)"
	switch {
	case f.token != "":
		auth = "token"
	case f.basicAuth != "":
		auth = "basic"
	}
	a.log.Info("txoutbox: console: serving", "addr", "http://"+ln.Addr().String()+"/", "auth", auth, "read_only", f.readOnly)
	return func() {
		cancel()
		sctx, stop := context.WithTimeout(context.Background(), 5*time.Second)
		defer stop()
		_ = srv.Shutdown(sctx)
	}, nil
}

// groupIndex is the page at the root of console --config: the outboxes,
// each a link to its console.
var groupIndex = template.Must(template.New("index").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>txoutbox: {{len .}} outboxes</title></head>
<body><h1>Outboxes</h1><ul>
{{range .}}<li><a href="{{.Path}}/">{{.Name}}</a> (table {{.Table}})</li>
{{end}}</ul></body></html>
`))

// serveGroupConsole is console --config: the console of every outbox of
// a relay --config file, each under /NAME/ and titled with its name, and
// an index of them at /. Outboxes on one DSN share a pool; one whose
// database is down at start still gets its console, which shows the error
// until the database answers.
func (a *app) serveGroupConsole(ctx context.Context, f consoleFlags, path string, lagThreshold time.Duration) (func(), error) {
	specs, err := readGroupFile(path, (*outboxSpec).resolveTable)
	if err != nil {
		return nil, err
	}
	ps := &pools{dbs: map[string]*database{}}
	type entry struct{ Name, Path, Table string }
	var (
		index  []entry
		runs   []func(context.Context) error
		first  *console.Console
		byName = map[string]http.Handler{}
	)
	for _, spec := range specs {
		log := a.log.With("outbox", spec.Name)
		db, err := ps.get(spec.dsn)
		if err != nil {
			ps.close()
			return nil, err
		}
		ob, err := sqlxoutbox.NewDB(db.db, sqlxoutbox.Options{Dialect: db.dialect, Table: spec.Table, Logger: log})
		if err != nil {
			ps.close()
			return nil, fmt.Errorf("%w: outbox %q: %w", ErrUsage, spec.Name, err)
		}
		prefix := "/" + url.PathEscape(spec.Name)
		opts := console.Options{Title: spec.Name, Prefix: prefix, ReadOnly: f.readOnly, Token: f.token, BasicAuth: f.basicAuth,
			LagThreshold: lagThreshold, Logger: log}
		if err := a.consoleExtras(ctx, f, db, spec.Table, ob, &opts); err != nil {
			log.Warn("txoutbox: console: the outbox's database does not answer; its console shows the backlog once it does, without the leases, inbox or log pages until a restart", "error", err)
		}
		c, err := console.New(ob, opts)
		if err != nil {
			ps.close()
			return nil, err
		}
		byName[spec.Name] = http.StripPrefix("/"+spec.Name, c)
		runs = append(runs, c.Run)
		index = append(index, entry{Name: spec.Name, Path: prefix, Table: spec.Table})
		if first == nil {
			first = c
		}
	}
	// The index names the outboxes: behind the consoles' authentication.
	indexPage := first.Protect(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
		_ = groupIndex.Execute(w, index)
	}))
	// By the path's first segment, unescaped: an outbox's name may hold
	// any character, which a pattern of net/http's mux may not.
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			indexPage.ServeHTTP(w, r)
			return
		}
		name, rest, slash := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		c, ok := byName[name]
		switch {
		case !ok:
			http.NotFound(w, r)
		case !slash && rest == "":
			http.Redirect(w, r, "/"+url.PathEscape(name)+"/", http.StatusMovedPermanently)
		default:
			c.ServeHTTP(w, r)
		}
	})
	stop, err := a.serveConsoleHandler(ctx, f, h, runs...)
	if err != nil {
		ps.close()
		return nil, err
	}
	return func() { stop(); ps.close() }, nil
}

func (a *app) consoleCommand() *cobra.Command {
	var (
		f            consoleFlags
		lagThreshold time.Duration
		config       string
	)
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the operations console: backlog, dead letters, events",
		Long: `console serves a web page for operators: the backlog (pending, oldest
pending, dead, published, by event type, with charts), the dead letters
grouped by error with bulk retry and purge, and the events, searchable, with
their detail and replay.

It listens on loopback by default. To listen beyond it, set --console-token or
--console-basic-auth. Every action is a confirmed POST protected against
cross-site requests, and is logged with who did it; --console-read-only
offers none. The console shows no DSN and no secret.

With --config FILE (the file of 'txoutbox relay --config'), it serves the
console of every outbox the file lists, each under /NAME/ and titled with its
name, and an index of them at /. The DSNs and tables come from the file.

Inside an application, mount package console's handler under your own router
and authentication instead; 'txoutbox relay --console-addr' serves it next to
the relay.`,
		Example: `  txoutbox console --dsn "$DATABASE_URL"                  # http://127.0.0.1:8080/
  txoutbox console --addr :8080 --console-token "$(openssl rand -hex 16)" --console-read-only`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check("addr"); err != nil {
				return err
			}
			if config != "" {
				stop, err := a.serveGroupConsole(cmd.Context(), f, config, lagThreshold)
				if err != nil {
					return err
				}
				<-cmd.Context().Done()
				stop()
				return nil
			}
			db, ob, err := a.openOutbox(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			stop, err := a.serveConsole(cmd.Context(), f, db, ob, lagThreshold)
			if err != nil {
				return err
			}
			<-cmd.Context().Done()
			stop()
			return nil
		},
	}
	f.register(cmd, "addr", "127.0.0.1:8080", "address to serve the console on (loopback by default)")
	cmd.Flags().DurationVar(&lagThreshold, "lag-threshold", time.Minute, "oldest pending age the overview shows as lagging")
	cmd.Flags().StringVar(&config, "config", "", "serve the console of every outbox of this relay --config file, each under /NAME/, instead of --dsn's")
	return cmd
}
