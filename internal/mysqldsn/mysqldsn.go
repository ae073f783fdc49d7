// Package mysqldsn turns a mysql:// URL into the DSN of
// github.com/go-sql-driver/mysql, so that txoutbox's CLI and test fixtures
// take MySQL and MariaDB addresses in the URL form they take PostgreSQL's.
package mysqldsn

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// ErrNotMySQL is returned for a string that is neither a mysql:// URL nor
// the driver's own DSN.
var ErrNotMySQL = errors.New("mysqldsn: not a MySQL address")

// IsURL reports whether s is a mysql:// or mariadb:// URL.
func IsURL(s string) bool {
	return strings.HasPrefix(s, "mysql://") || strings.HasPrefix(s, "mariadb://")
}

// IsDriverDSN reports whether s looks like the driver's own DSN
// (user:password@tcp(host:port)/dbname?params) rather than a URL.
func IsDriverDSN(s string) bool {
	return !strings.Contains(s, "://") && (strings.Contains(s, "@tcp(") || strings.Contains(s, "@unix(") || strings.HasPrefix(s, "tcp(") || strings.HasPrefix(s, "unix("))
}

// Config parses s, a mysql:// (or mariadb://) URL or the driver's own DSN,
// into the driver's configuration. A URL's host defaults to 127.0.0.1:3306
// and its query parameters are the driver's (parseTime, tls, ...).
func Config(s string) (*mysql.Config, error) {
	if IsDriverDSN(s) {
		cfg, err := mysql.ParseDSN(s)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNotMySQL, err)
		}
		return cfg, nil
	}
	if !IsURL(s) {
		return nil, fmt.Errorf("%w: want mysql://user:password@host:port/dbname or user:password@tcp(host:port)/dbname", ErrNotMySQL)
	}
	u, err := url.Parse(s)
	if err != nil {
		// url.Parse's error quotes the whole URL, password included.
		return nil, fmt.Errorf("%w: the URL does not parse", ErrNotMySQL)
	}
	host := u.Host
	if host == "" {
		host = "127.0.0.1:3306"
	} else if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(strings.Trim(host, "[]"), "3306")
	}
	cfg, err := mysql.ParseDSN("tcp(" + host + ")/" + strings.TrimPrefix(u.Path, "/") + "?" + u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotMySQL, err)
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	return cfg, nil
}

// DriverDSN is Config formatted as the driver's DSN.
func DriverDSN(s string) (string, error) {
	cfg, err := Config(s)
	if err != nil {
		return "", err
	}
	return cfg.FormatDSN(), nil
}
