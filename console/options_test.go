package console_test

import (
	"errors"
	"testing"

	"github.com/txoutbox/txoutbox/console"
	"github.com/txoutbox/txoutbox/core"
)

// unusedStore satisfies console.Store for tests of New's options, which
// refuse them before the store is used.
type unusedStore struct{ console.Store }

// Every refusal of New's options matches the one sentinel of that meaning,
// core.ErrInvalidOptions, as every other constructor's does.
func TestNewRefusesOptionsWithCoreSentinel(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		store console.Store
		opts  console.Options
	}{
		"no store":           {nil, console.Options{}},
		"BasicAuth no colon": {unusedStore{}, console.Options{BasicAuth: "nocolon"}},
		"negative threshold": {unusedStore{}, console.Options{LagThreshold: -1}},
		"negative interval":  {unusedStore{}, console.Options{SampleInterval: -1}},
		"relative prefix":    {unusedStore{}, console.Options{Prefix: "ops"}},
	} {
		_, err := console.New(tc.store, tc.opts)
		if !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("%s: %v, want core.ErrInvalidOptions", name, err)
		}
	}
}
