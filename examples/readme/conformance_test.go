package main

import (
	"testing"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
	"github.com/txoutbox/txoutbox/testing/sqlfixture"
)

// The README's conformance example, with sqlxoutbox as the store "of
// yours" and the test server's DSN.
func TestREADMEConformance(t *testing.T) {
	dsn := testenv.Env(t, "TXOUTBOX_PG_DSN")
	newMyStore := func(db *sqlfixture.DB) *sqlxoutbox.Outbox {
		s, err := sqlxoutbox.NewDB(db.DB, sqlxoutbox.Options{Table: db.Table.String()})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// README: conformance
	newStore := func(t *testing.T) *outboxtest.StoreFixture {
		db := sqlfixture.Open(t, dsn, sqlfixture.Options{}) // a fresh database on a real server
		return db.StoreFixture(newMyStore(db))              // your store, on db.DB and db.Table
	}
	outboxtest.RunStore(t, newStore)
	outboxtest.RunOrderedStore(t, newStore) // if Capabilities().OrderedClaims
	// README: end
}
