package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
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
func (a *app) consoleExtras(ctx context.Context, f consoleFlags, db *database, ob *sqlxoutbox.Outbox, opts *console.Options) error {
	exists := func(table string) bool {
		id, err := dialect.ValidateIdentifier(table)
		if err != nil {
			return false
		}
		_, err = db.db.ExecContext(ctx, "SELECT 1 FROM "+db.dialect.Quote(id)+" WHERE 1 = 0")
		return err == nil
	}
	if db.dialect != dialect.SQLite && exists(dialect.DefaultLeaseTable) {
		l, err := ordered.NewLeaser(db.db, db.dialect, ordered.LeaserOptions{Table: a.table, Logger: a.log})
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
			names := logrelay.Names{Table: a.table, Slot: f.slot}
			opts.Slot = func(ctx context.Context) (logrelay.SlotStatus, error) { return logrelay.StatusDB(ctx, db.db, names) }
		}
	}
	if db.dialect == dialect.MySQL {
		names := binlogrelay.Names{Table: a.table, Name: f.stream}
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
	if err := a.consoleExtras(ctx, f, db, ob, &opts); err != nil {
		return nil, err
	}
	c, err := console.New(ob, opts)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return nil, fmt.Errorf("console: listen on %s: %w", f.addr, err)
	}
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second}
	cctx, cancel := context.WithCancel(ctx)
	go func() { _ = c.Run(cctx) }()
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

func (a *app) consoleCommand() *cobra.Command {
	var (
		f            consoleFlags
		lagThreshold time.Duration
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
	return cmd
}
