// Package testenv gives tests the real services that scripts/services.sh
// starts (make test). A test that needs a service and does not find it
// fails; it never skips, so that a CI run without the service cannot pass.
package testenv

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/txoutbox/txoutbox/testing/sqlfixture"
)

const hint = "start the services with `make test` (or `scripts/services.sh start && . .services/env`)"

// Env returns the environment variable name, failing the test when it is
// unset.
func Env(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: this test needs a real service; %s", name, hint)
	}
	return v
}

// Fsync reports whether the servers tests start of their own flush each
// commit to disk, as scripts/services.sh's do: yes unless TXOUTBOX_FSYNC
// is "off" (make test). Their crashes kill the server process, whose
// writes the page cache keeps, so the outcome is the same either way.
func Fsync() bool { return os.Getenv("TXOUTBOX_FSYNC") != "off" }

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// PostgresDSN returns the DSN of a new, empty PostgreSQL database made for
// this test and dropped when it ends.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	return sqlfixture.CreatePostgresDatabase(t, Env(t, "TXOUTBOX_PG_DSN"))
}

// MaxOpenConns caps the pool OpenPostgres returns. database/sql's default
// is no cap, so a test that runs 80 deliveries at once opens 80 server
// connections, and parallel tests in two packages at once then exhaust the
// server's max_connections (CI once failed with SQLSTATE 53300). Sixteen
// still lets every concurrency test overlap its transactions: a delivery
// waiting for a row lock waits on one that holds a connection.
const MaxOpenConns = sqlfixture.MaxOpenConns

// OpenPostgres opens a fresh database (see PostgresDSN) with the pgx
// database/sql driver, its pool capped at MaxOpenConns, and closes it when
// the test ends.
func OpenPostgres(t testing.TB) *sql.DB {
	t.Helper()
	return OpenPostgresDSN(t, PostgresDSN(t))
}

// OpenPostgresDSN is OpenPostgres on the database of dsn.
func OpenPostgresDSN(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	sqlfixture.SizePool(db)
	t.Cleanup(func() { db.Close() })
	return db
}

// MySQLDSN returns the DSN (in the form of github.com/go-sql-driver/mysql)
// of a new, empty MariaDB database made for this test and dropped when it
// ends.
func MySQLDSN(t testing.TB) string {
	t.Helper()
	return sqlfixture.CreateMySQLDatabase(t, Env(t, "TXOUTBOX_MYSQL_DSN"))
}

// OpenMySQL opens a fresh MariaDB database (see MySQLDSN), its pool capped
// at MaxOpenConns, and closes it when the test ends. params are driver
// parameters to add to the DSN, such as "parseTime=true" for GORM.
func OpenMySQL(t testing.TB, params ...string) *sql.DB {
	t.Helper()
	dsn := MySQLDSN(t)
	for i, p := range params {
		if i == 0 && !strings.Contains(dsn, "?") {
			dsn += "?" + p
		} else {
			dsn += "&" + p
		}
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("open mysql: %v", err)
	}
	sqlfixture.SizePool(db)
	t.Cleanup(func() { db.Close() })
	return db
}

// OpenPgxPool opens a pgx pool on dsn (a database of PostgresDSN), capped
// at MaxOpenConns connections like OpenPostgres, and closes it when the
// test ends.
func OpenPgxPool(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parse pool config: %v", err)
	}
	cfg.MaxConns = MaxOpenConns
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatalf("open pgx pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// AMQPURL returns the URL of the RabbitMQ that make test starts.
func AMQPURL(t testing.TB) string {
	t.Helper()
	return Env(t, "TXOUTBOX_AMQP_URL")
}

// SNSEndpoint returns the URL of the SNS/SQS emulator that make test starts.
func SNSEndpoint(t testing.TB) string {
	t.Helper()
	return Env(t, "TXOUTBOX_SNS_ENDPOINT")
}

// RabbitMQCtl runs rabbitmqctl against the test node (e.g. "stop_app",
// "start_app") and fails the test if it fails.
func RabbitMQCtl(t testing.TB, args ...string) string {
	t.Helper()
	base := strings.Fields(Env(t, "TXOUTBOX_RABBITMQCTL"))
	cmd := exec.Command(base[0], append(base[1:], args...)...)
	cmd.Env = append(os.Environ(), strings.Fields(os.Getenv("TXOUTBOX_RABBITMQ_ENV"))...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// RandomSuffix returns 12 random hex characters, for names of databases,
// queues and topics that tests running in parallel must not share.
func RandomSuffix() string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b)
}

// Logger returns a logger that writes to t's log, at level and above: a
// component's lines then show with the test that failed.
func Logger(t testing.TB, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(tLog{t}, &slog.HandlerOptions{Level: level}))
}

// tLog writes to a test's log.
type tLog struct{ t testing.TB }

func (w tLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
