package faultmatrix_test

import (
	"sync"
	"testing"
)

// crashMu lets one cell at a time crash its server: the crash cells of
// the brokers run in parallel, each on a server of its own, but two
// immediate shutdowns at once on a 2-core machine stretch recovery.
var crashMu sync.Mutex

// crashable is a server of the cell's own that the crash fault stops
// without a clean shutdown and starts again; the outbox is a database of
// it.
type crashable interface {
	NewDatabase(t testing.TB) string
	Crash(t testing.TB)
	Start(t testing.TB)
}
