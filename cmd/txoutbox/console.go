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
	"github.com/txoutbox/txoutbox/console"
)

// consoleFlags are the flags of the console, in `txoutbox console` and in
// `txoutbox relay --console-addr`.
type consoleFlags struct {
	addr, token, basicAuth, title string
	readOnly                      bool
}

func (f *consoleFlags) register(cmd *cobra.Command, addrFlag, addrDefault, addrHelp string) {
	fl := cmd.Flags()
	fl.StringVar(&f.addr, addrFlag, addrDefault, addrHelp)
	fl.StringVar(&f.token, "console-token", "", "require this token (open the console once with ?token=..., or send Authorization: Bearer ...); needed to listen beyond loopback")
	fl.StringVar(&f.basicAuth, "console-basic-auth", "", "require HTTP basic auth, user:password; needed to listen beyond loopback")
	fl.BoolVar(&f.readOnly, "console-read-only", false, "show, but offer and accept no action")
	fl.StringVar(&f.title, "console-title", "", "name of the outbox on every page (default: the table)")
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

// serveConsole serves the console of ob on f.addr until ctx ends.
func (a *app) serveConsole(ctx context.Context, f consoleFlags, ob *sqlxoutbox.Outbox, lagThreshold time.Duration) (func(), error) {
	title := f.title
	if title == "" {
		title = a.table
	}
	c, err := console.New(ob, console.Options{Title: title, ReadOnly: f.readOnly, Token: f.token, BasicAuth: f.basicAuth,
		LagThreshold: lagThreshold, Logger: a.log})
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
			stop, err := a.serveConsole(cmd.Context(), f, ob, lagThreshold)
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
