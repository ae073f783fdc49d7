package sqlinbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
)

func TestNewOptions(t *testing.T) {
	db := fixtures.OpenInboxSQLite(t, false)
	if _, err := sqlinbox.New(nil, sqlinbox.Options{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("New(nil) = %v, want ErrInvalidOptions", err)
	}
	if _, err := sqlinbox.New(db, sqlinbox.Options{Table: "x; DROP TABLE y"}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("New(bad table) = %v, want ErrInvalidOptions", err)
	}
	ib, err := sqlinbox.New(db, sqlinbox.Options{Table: "consumer_inbox"})
	if err != nil {
		t.Fatal(err)
	}
	if ib.Table() != "consumer_inbox" || ib.Dialect().Name() != "sqlite" {
		t.Errorf("Table %q, Dialect %v; want consumer_inbox, sqlite", ib.Table(), ib.Dialect())
	}
	// The DSN of this database sets no busy_timeout: CheckSQLite says so.
	if d, err := ib.CheckSQLite(t.Context()); err != nil || d != 0 {
		t.Errorf("CheckSQLite = (%v, %v), want (0, nil)", d, err)
	}
	if d, err := sqlinbox.New(fixtures.OpenInboxSQLite(t, true), sqlinbox.Options{}); err != nil {
		t.Fatal(err)
	} else if got, err := d.CheckSQLite(t.Context()); err != nil || got != 10*time.Second {
		t.Errorf("CheckSQLite = (%v, %v), want (10s, nil)", got, err)
	}
}

func TestTxHelpersOutsideHandler(t *testing.T) {
	if sqlinbox.Tx(context.Background()) != nil || sqlinbox.Txx(context.Background()) != nil {
		t.Fatal("Tx/Txx outside a handler are not nil")
	}
	db := fixtures.OpenInboxSQLite(t, true)
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	ctx := sqlinbox.ContextWithTx(t.Context(), tx, nil)
	if sqlinbox.Tx(ctx) != tx || sqlinbox.Txx(ctx) != nil {
		t.Fatal("ContextWithTx: Tx/Txx do not find the transaction")
	}
}
