package sqlitebusy

import (
	"errors"
	"fmt"
	"testing"
)

type codedErr int

func (e codedErr) Error() string { return fmt.Sprintf("code %d", int(e)) }
func (e codedErr) Code() int     { return int(e) }

func TestIs(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{codedErr(5), true},
		{codedErr(6), true},
		{fmt.Errorf("wrapped: %w", codedErr(5|(1<<8))), true}, // extended code SQLITE_BUSY_RECOVERY
		{codedErr(19), false},
		{errors.New("database is locked"), true},
		{errors.New("database table is locked"), true},
		{errors.New("SQLITE_BUSY: busy"), true},
		{errors.New("no such table"), false},
	} {
		if got := Is(tc.err); got != tc.want {
			t.Errorf("Is(%v) = %t, want %t", tc.err, got, tc.want)
		}
	}
}
