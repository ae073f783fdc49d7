// Package logbuf has the tests' log destination: a buffer that a relay's
// goroutines or a child process write while the test reads it.
package logbuf

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer safe for concurrent writers and readers. The zero
// value is empty and ready.
type Buffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	lines int
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines += bytes.Count(p, []byte("\n"))
	return b.b.Write(p)
}

// Lines returns how many lines were written so far (newlines), without
// copying them: a test that polls a relay's output of thousands of events
// would otherwise copy all of it at every poll.
func (b *Buffer) Lines() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lines
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
