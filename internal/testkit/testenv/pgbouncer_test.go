package testenv_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
)

// A test's own bouncer never sees a cancel request, which can make
// PgBouncer 1.18 exit: pgx's cancel of a query whose context ended stops
// at the gate, and the bouncer serves on.
func TestPgBouncerKeepsCancelsOut(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	b := testenv.StartPgBouncer(t, u.Host)
	conn, err := pgx.Connect(t.Context(), b.DSN(strings.TrimPrefix(u.Path, "/")))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	_, err = conn.Exec(ctx, "SELECT pg_sleep(5)")
	cancel()
	if err == nil {
		t.Fatal("pg_sleep(5) ended within its 200 ms context")
	}
	// pgx sends the cancel request on a connection of its own, beside the
	// query's; the gate logs it as it closes it.
	wait.For(t, "pgx's cancel request at the gate", func() (bool, any) {
		l := b.GateLog()
		return strings.Contains(l, "dropped a cancel request"), l
	})
	again, err := pgx.Connect(t.Context(), b.DSN(strings.TrimPrefix(u.Path, "/")))
	if err != nil {
		t.Fatalf("the bouncer after the cancel: %v", err)
	}
	defer again.Close(context.Background())
	var one int
	if err := again.QueryRow(t.Context(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("the bouncer after the cancel: SELECT 1 = %d, %v", one, err)
	}
}
