package seal_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/seal"
	"github.com/txoutbox/txoutbox/testing/sqlfixture"
)

type recorder struct {
	mu  sync.Mutex
	got []core.Event
}

func (r *recorder) Publish(_ context.Context, evs []core.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, evs...)
	return nil
}

func (*recorder) Capabilities() core.PublisherCapabilities { return core.PublisherCapabilities{} }

// TestSealedThroughTheOutbox, on each real database with a local keeper:
// Enqueue seals through the hook, the table holds only ciphertext, the
// relay opens what it publishes, and an event sealed with a key the relay
// lacks is dead-lettered at once with a message that names the key.
func TestSealedThroughTheOutbox(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := "sqlite:"
			switch backend {
			case "postgres":
				dsn = testenv.Env(t, "TXOUTBOX_PG_DSN")
			case "mysql":
				dsn = testenv.Env(t, "TXOUTBOX_MYSQL_DSN")
			}
			fx := sqlfixture.Open(t, dsn, sqlfixture.Options{SkipInbox: true})
			k1 := seal.Key{ID: "k1", Keeper: keeperOf(t, "base64key://")}
			stranger := seal.Key{ID: "k9", Keeper: keeperOf(t, "base64key://")}
			producer := newSealer(t, seal.Options{Key: k1, Headers: []string{"ssn"}})
			other := newSealer(t, seal.Options{Key: stranger, Headers: []string{"ssn"}})
			enqueue := func(s *seal.Sealer, evs ...core.Event) {
				ob, err := sqlxoutbox.NewDB(fx.DB, sqlxoutbox.Options{Dialect: fx.Dialect, Table: fx.Table.String(),
					Hooks: []core.EnqueueHook{s.Hook()}})
				if err != nil {
					t.Fatal(err)
				}
				tx, err := fx.DB.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := ob.Enqueue(ctx, tx, evs...); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
			var evs []core.Event
			for i := 0; i < 20; i++ {
				ev := event("")
				evs = append(evs, ev)
			}
			enqueue(producer, evs...)
			enqueue(other, event(""))

			var stored []string
			rows, err := fx.DB.Query("SELECT payload, headers FROM " + fx.Dialect.Quote(fx.Table))
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var p, h sql.NullString
				if err := rows.Scan(&p, &h); err != nil {
					t.Fatal(err)
				}
				stored = append(stored, p.String+h.String)
			}
			rows.Close()
			if len(stored) != 21 {
				t.Fatalf("%d rows", len(stored))
			}
			for _, s := range stored {
				if strings.Contains(s, "ada@") || strings.Contains(s, "6789") || !strings.Contains(s, "txoutbox_sealed") {
					t.Fatalf("the table holds plaintext: %s", s)
				}
			}

			ob, err := sqlxoutbox.NewDB(fx.DB, sqlxoutbox.Options{Dialect: fx.Dialect, Table: fx.Table.String()})
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{}
			relay, err := core.NewRelay(ob, producer.Publisher(rec), core.RelayOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := relay.Drain(ctx); err != nil {
				t.Fatal(err)
			}
			if len(rec.got) != 20 {
				t.Fatalf("broker got %d events, want the 20 the relay can open", len(rec.got))
			}
			for i, ev := range rec.got {
				// Enqueue leaves the caller's events as stored: sealed.
				if ev.ID != evs[i].ID || !seal.IsSealed(evs[i].Payload) || !jsonEqual(ev.Payload, event("").Payload) || ev.Headers["ssn"] != "123-45-6789" {
					t.Fatalf("broker got %s %s %v, want the plaintext of %s", ev.ID, ev.Payload, ev.Headers, evs[i].ID)
				}
			}
			st, err := ob.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Dead != 1 || st.Pending != 0 {
				t.Fatalf("stats %+v: want the stranger's event dead at once", st)
			}
			dead, err := ob.ListDead(ctx, sqlxoutbox.DeadFilter{}, sqlxoutbox.Page{})
			if err != nil || len(dead) != 1 || !strings.Contains(dead[0].LastError, `"k9"`) || dead[0].AttemptCount != 1 {
				t.Fatalf("dead %+v, %v: want one, after one attempt, its error naming key k9", dead, err)
			}
		})
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ja, _ := json.Marshal(x)
	jb, _ := json.Marshal(y)
	return string(ja) == string(jb)
}
