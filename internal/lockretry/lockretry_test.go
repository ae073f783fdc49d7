package lockretry

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/txoutbox/txoutbox/dialect"
)

type codedErr int

func (e codedErr) Error() string { return fmt.Sprintf("code %d", int(e)) }
func (e codedErr) Code() int     { return int(e) }

func TestSQLiteBusy(t *testing.T) {
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
		if got := SQLiteBusy(tc.err); got != tc.want {
			t.Errorf("SQLiteBusy(%v) = %t, want %t", tc.err, got, tc.want)
		}
	}
}

func TestMySQLConflict(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&mysql.MySQLError{Number: 1213}, true},
		{fmt.Errorf("record: %w", &mysql.MySQLError{Number: 1205}), true},
		{&mysql.MySQLError{Number: 1062}, false},
		{errors.New("Error 1213: deadlock"), false}, // only the driver's typed error counts
	} {
		if got := MySQLConflict(tc.err); got != tc.want {
			t.Errorf("MySQLConflict(%v) = %t, want %t", tc.err, got, tc.want)
		}
		if got := Retryable(dialect.MySQL, tc.err); got != tc.want {
			t.Errorf("Retryable(MySQL, %v) = %t", tc.err, got)
		}
		if Retryable(dialect.Postgres, tc.err) {
			t.Errorf("Retryable(Postgres, %v) = true", tc.err)
		}
	}
}
