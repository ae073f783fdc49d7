package sqlxoutbox_test

import (
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// The store suite through PgBouncer in transaction pooling mode, with
// pgx's statement cache off (default_query_exec_mode=exec: PgBouncer
// 1.18 keeps no prepared statement across transactions).
func TestStoreThroughPgBouncer(t *testing.T) {
	t.Parallel()
	outboxtest.RunStore(t, func(t *testing.T) *outboxtest.StoreFixture {
		dsn, _ := testenv.PgBouncerDSN(t, "default_query_exec_mode", "exec")
		db := testenv.OpenPostgresDSN(t, dsn)
		return fixtures.NewSQLX(t, sqlx.NewDb(db, "pgx"), dialect.Postgres, fixtures.Options{Logger: quiet}).StoreFixture()
	})
}
