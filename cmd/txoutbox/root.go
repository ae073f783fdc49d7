package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// Exit codes. Scripts and cron jobs rely on them.
const (
	exitOK      = 0
	exitError   = 1 // the command failed
	exitUsage   = 2 // bad flags or arguments
	exitLagging = 3 // stats --max-age: the oldest pending event is too old
)

// Sentinel errors of the command line, wrapped by the errors commands return.
var (
	// ErrUsage marks an error in the flags or arguments.
	ErrUsage = errors.New("usage")
	// ErrAborted is returned when the operator did not confirm a destructive
	// action.
	ErrAborted = errors.New("aborted: not confirmed")
	// ErrLagging is returned by stats --max-age when the oldest pending
	// event is older than the limit.
	ErrLagging = errors.New("outbox is lagging")
)

// envPrefix prefixes the environment variable of every flag.
const envPrefix = "TXOUTBOX_"

// noEnv lists flags that no environment variable may set: a --yes or --all
// left in an environment would turn every later purge into a silent one, and
// a leftover selector (TXOUTBOX_TYPE=...) would quietly narrow or widen what
// a dead-letter or replay command touches. What an operator selects is said
// on the command line; only configuration comes from the environment.
var noEnv = map[string]bool{
	"help": true, "yes": true, "all": true, "version": true,
	"id": true, "seq": true, "type": true, "dead-before": true, "after": true,
	"from-seq": true, "to-seq": true, "since": true, "until": true, "aggregate-type": true, "aggregate-id": true,
}

// app is one run of the command line: its streams and global flags.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	dsn       string
	table     string
	logLevel  string
	logFormat string
	keepers   []string

	log *slog.Logger
}

// Execute runs the command line with args and returns the process's exit
// code.
func Execute(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	secrets := collectSecrets(args)
	stdout, stderr = newRedactingWriter(stdout, secrets), newRedactingWriter(stderr, secrets)
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	if errors.Is(err, core.ErrNotMigrated) {
		// It will not heal: say what to do, the driver's words at debug.
		if a.log != nil {
			a.log.Debug("txoutbox: the table is missing", "error", err)
		}
		fmt.Fprintf(stderr, "txoutbox: table %s does not exist: run 'txoutbox migrate' (with the same --dsn and --table) first\n", a.table)
		return exitError
	}
	if errors.Is(err, dialect.ErrInvalidIdentifier) {
		err = fmt.Errorf("%w: %w", ErrUsage, err)
	}
	// Errors from the library already name it.
	fmt.Fprintf(stderr, "txoutbox: %s\n", strings.TrimPrefix(err.Error(), "txoutbox: "))
	switch {
	case errors.Is(err, ErrUsage):
		fmt.Fprintln(stderr, "Run 'txoutbox --help' for usage.")
		return exitUsage
	case errors.Is(err, ErrLagging):
		return exitLagging
	}
	return exitError
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "txoutbox",
		Short: "Operate a transactional outbox: migrate, relay, stats, dead letters, replay, cleanup, archive",
		Long: `txoutbox operates a transactional outbox.

Producers write events into the outbox table in the same transaction as their
business data. The relay (txoutbox relay) claims committed events in batches,
publishes them to a broker and marks them published. Events that fail are
retried with backoff and dead-lettered after --max-attempts; dead events are
kept, listed by 'txoutbox dead list' and re-queued by 'txoutbox dead retry'.

Every flag can be set by an environment variable named TXOUTBOX_ and the flag
in upper case, dashes as underscores: --dsn is TXOUTBOX_DSN, --log-format is
TXOUTBOX_LOG_FORMAT. A flag on the command line wins over the environment.
Flags that select events (--id, --type, --since, ...) and --yes and --all have
no variable, on purpose: what a command touches is said on its command line.`,
		Example: `  # Try it out: create the tables, run a relay that prints what it publishes.
  export TXOUTBOX_DSN='postgres://app:secret@localhost:5432/app?sslmode=disable'
  txoutbox migrate
  txoutbox relay --broker log://

  # In another terminal: how is it doing?
  txoutbox stats
  txoutbox stats --format json | jq .oldest_pending_age_seconds

  # Production: RabbitMQ, metrics and health on :9090.
  txoutbox relay --broker 'amqp://user:pass@rabbitmq:5672/' --http-addr :9090`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd.Flags()); err != nil {
				return err
			}
			if _, err := dialect.ValidateIdentifier(a.table); err != nil {
				return fmt.Errorf("%w: --table: %w", ErrUsage, err)
			}
			return a.setupLogging()
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	})
	pf := root.PersistentFlags()
	pf.StringVar(&a.dsn, "dsn", "", "database URL: postgres://user:pass@host:5432/db?sslmode=disable, mysql://user:pass@host:3306/db, or sqlite:path/to/file.db")
	pf.StringVar(&a.table, "table", "outbox_events", "outbox table name (optionally schema.table)")
	pf.StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	pf.StringVar(&a.logFormat, "log-format", "text", "log format: text or json (logs go to stderr)")
	pf.StringArrayVar(&a.keepers, "keeper", nil, "ID=URL of a key that opens sealed events (repeat per key version; see 'txoutbox relay --help')")

	root.AddCommand(
		a.migrateCommand(),
		a.relayCommand(),
		a.statsCommand(),
		a.deadCommand(),
		a.replayCommand(),
		a.cleanupCommand(),
		a.archiveCommand(),
		a.logCommand(),
		a.consoleCommand(),
	)
	documentEnv(root)
	return root
}

// envName is the environment variable of a flag.
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// documentEnv appends the environment variable to the usage of every flag
// that has one, so that --help shows it.
func documentEnv(cmd *cobra.Command) {
	doc := func(f *pflag.Flag) {
		if !noEnv[f.Name] && !strings.Contains(f.Usage, "$"+envPrefix) {
			f.Usage += " [$" + envName(f.Name) + "]"
		}
	}
	cmd.LocalFlags().VisitAll(doc)
	cmd.PersistentFlags().VisitAll(doc)
	for _, c := range cmd.Commands() {
		documentEnv(c)
	}
}

// applyEnv sets every flag that was not given on the command line from its
// environment variable.
func applyEnv(fs *pflag.FlagSet) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || noEnv[f.Name] {
			return
		}
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok || v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s=%q: %w", ErrUsage, envName(f.Name), v, err))
		}
	})
	return errors.Join(errs...)
}

func (a *app) setupLogging() error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(a.logLevel)); err != nil {
		return fmt.Errorf("%w: --log-level %q: want debug, info, warn or error", ErrUsage, a.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch a.logFormat {
	case "text":
		h = slog.NewTextHandler(a.stderr, opts)
	case "json":
		h = slog.NewJSONHandler(a.stderr, opts)
	default:
		return fmt.Errorf("%w: --log-format %q: want text or json", ErrUsage, a.logFormat)
	}
	a.log = slog.New(h)
	// Libraries that log through slog.Default (broker clients, core options
	// left nil) then log in the same format.
	slog.SetDefault(a.log)
	return nil
}

// requireDSN returns the DSN or a usage error naming both ways to give it.
func (a *app) requireDSN() (string, error) {
	if a.dsn == "" {
		return "", fmt.Errorf("%w: no database: pass --dsn or set %s", ErrUsage, envName("dsn"))
	}
	return a.dsn, nil
}

// usagef returns an error wrapping ErrUsage.
func usagef(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUsage, fmt.Sprintf(format, args...))
}
