package testenv

import (
	"net/url"
	"testing"
)

// PgBouncerDSN makes a fresh PostgreSQL database (as PostgresDSN) and
// returns its DSN through the PgBouncer that scripts/services.sh runs in
// transaction pooling mode (TXOUTBOX_PGBOUNCER_DSN), and its direct DSN.
// params are added to the bouncer's DSN's query (pgx's
// default_query_exec_mode=exec, say).
func PgBouncerDSN(t testing.TB, params ...string) (bouncer, direct string) {
	t.Helper()
	direct = PostgresDSN(t)
	d, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	b, err := url.Parse(Env(t, "TXOUTBOX_PGBOUNCER_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	b.Path = d.Path
	q := b.Query()
	for i := 0; i+1 < len(params); i += 2 {
		q.Set(params[i], params[i+1])
	}
	b.RawQuery = q.Encode()
	return b.String(), direct
}
