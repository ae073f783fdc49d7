package testenv

import "testing"

// The ports of the servers tests start lie below the ephemeral range, out
// of reach of the run's outgoing connections, and are never handed out
// twice by one process.
func TestFreePortBelowTheEphemeralRange(t *testing.T) {
	t.Parallel()
	low := ephemeralLow()
	seen := map[int]bool{}
	for range 200 {
		p := FreePort(t)
		if p >= low || p < 20000 {
			t.Fatalf("port %d: want one in [20000, %d)", p, low)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
