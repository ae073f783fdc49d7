// Command txoutbox operates a transactional outbox: it applies the
// migrations, runs the relay as its own process, and inspects and steers the
// outbox (stats, dead letters, replay, retention).
//
// Every flag can also be set by an environment variable: TXOUTBOX_ and the
// flag's name in upper case with dashes as underscores (--dsn is
// TXOUTBOX_DSN, --log-format is TXOUTBOX_LOG_FORMAT). A flag given on the
// command line wins. Run `txoutbox --help` and `txoutbox COMMAND --help`
// for the commands and examples.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal the default handling returns, so that a second
	// Ctrl-C kills a relay that is slow to finish its batch.
	context.AfterFunc(ctx, stop)
	code := Execute(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
