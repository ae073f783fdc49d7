package dialect_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// SortClaimed puts events into claim order, next attempt then seq, whether
// they come in order, reversed or shuffled.
func TestSortClaimed(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	var want []core.Event
	for i := range 50 {
		// Pairs share a next attempt, so that seq breaks the tie.
		want = append(want, core.Event{Seq: int64(100 + i), NextAttemptAt: base.Add(time.Duration(i/2) * time.Millisecond)})
	}
	seqs := func(evs []core.Event) []int64 {
		out := make([]int64, len(evs))
		for i := range evs {
			out[i] = evs[i].Seq
		}
		return out
	}
	reversed := slices.Clone(want)
	slices.Reverse(reversed)
	shuffled := slices.Clone(want)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	for name, evs := range map[string][]core.Event{"sorted": slices.Clone(want), "reversed": reversed, "shuffled": shuffled, "empty": nil} {
		dialect.SortClaimed(evs)
		if name == "empty" {
			if len(evs) != 0 {
				t.Errorf("empty: %v", evs)
			}
			continue
		}
		if got := seqs(evs); !slices.Equal(got, seqs(want)) {
			t.Errorf("%s: sorted to %v", name, got)
		}
	}
}
