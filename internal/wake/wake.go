// Package wake keeps one core.Signal per database handle and outbox table,
// so that every adapter writing to a table in this process (sqlxoutbox's
// Enqueue, the GORM plugin, the pgx adapter) and every store a relay claims
// from share it, whichever was built first. A handle's signals go when the
// handle is garbage collected.
package wake

import (
	"runtime"
	"sync"
	"weak"

	"github.com/txoutbox/txoutbox/core"
)

type key struct {
	handle any // a weak.Pointer of the handle: comparable, and not keeping it alive
	table  string
}

var (
	mu      sync.Mutex
	signals = map[key]*core.Signal{}
)

// For returns the signal of table (as dialect.Identifier.String writes it)
// on the database handle h, creating it on first use.
func For[T any](h *T, table string) *core.Signal {
	k := key{handle: weak.Make(h), table: table}
	mu.Lock()
	defer mu.Unlock()
	if s, ok := signals[k]; ok {
		return s
	}
	s := &core.Signal{}
	signals[k] = s
	runtime.AddCleanup(h, func(k key) {
		mu.Lock()
		delete(signals, k)
		mu.Unlock()
	}, k)
	return s
}
