package mysqldsn

import (
	"errors"
	"testing"
)

func TestDriverDSN(t *testing.T) {
	for in, want := range map[string]string{
		"mysql://app:s%40cret@db.example:3307/shop?parseTime=true": "app:s@cret@tcp(db.example:3307)/shop?parseTime=true",
		"mariadb://app@db.example/shop":                            "app@tcp(db.example:3306)/shop",
		"mysql://app:pw@/shop":                                     "app:pw@tcp(127.0.0.1:3306)/shop",
		"app:pw@tcp(127.0.0.1:3306)/shop?interpolateParams=true":   "app:pw@tcp(127.0.0.1:3306)/shop?interpolateParams=true",
	} {
		got, err := DriverDSN(in)
		if err != nil || got != want {
			t.Errorf("DriverDSN(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"postgres://x@y/z", "mysql://app:pw@host/db?nosuchparam=%zz", "mysql://%zz"} {
		if _, err := DriverDSN(bad); !errors.Is(err, ErrNotMySQL) {
			t.Errorf("DriverDSN(%q) = %v, want ErrNotMySQL", bad, err)
		}
	}
}
