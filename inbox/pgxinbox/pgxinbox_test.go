package pgxinbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/inbox/pgxinbox"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// TestConformance runs the inbox suite on pgx: one effect per event and
// consumer, rollback with a failing or panicking handler, concurrent
// duplicates taking effect once, retention.
func TestConformance(t *testing.T) {
	t.Parallel()
	outboxtest.RunInbox(t, func(t *testing.T) *outboxtest.InboxFixture { return fixtures.PGXInbox(t) })
}

// Bad configuration and bad calls are refused before anything runs.
func TestRefusals(t *testing.T) {
	t.Parallel()
	if _, err := pgxinbox.New(nil, pgxinbox.Options{}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("nil DB: %v", err)
	}
	pool := testenv.OpenPgxPool(t, testenv.PostgresDSN(t))
	if _, err := pgxinbox.New(pool, pgxinbox.Options{Table: "processed; DROP TABLE x"}); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("bad table name: %v", err)
	}
	ib, err := pgxinbox.New(pool, pgxinbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	fn := func(context.Context) error { ran = true; return nil }
	if _, err := ib.Process(t.Context(), "", "id", fn); !errors.Is(err, core.ErrInvalidOptions) {
		t.Errorf("empty consumer: %v", err)
	}
	if _, err := ib.Process(t.Context(), "c", "", fn); !errors.Is(err, core.ErrMissingEventID) {
		t.Errorf("empty event ID: %v", err)
	}
	if ran {
		t.Error("the handler ran for a refused call")
	}
	if pgxinbox.Tx(t.Context()) != nil {
		t.Error("Tx outside a handler is not nil")
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired", n)
	}
}
