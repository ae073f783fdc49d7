package console_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/console"
	"github.com/txoutbox/txoutbox/dialect"
)

// Mount the console in an application, under its own path and behind its
// own authentication. The example runs in a schema of its own in the
// database of $TXOUTBOX_PG_DSN (make test sets it) and drops it at the end.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("TXOUTBOX_PG_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	schema := "console_example_" + strconv.Itoa(os.Getpid())
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	defer db.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck
	silent := slog.New(slog.DiscardHandler)
	table := schema + ".outbox_events"
	if err := dialect.Migrate(ctx, db, dialect.Postgres, dialect.MigrateOptions{Table: table, SkipInbox: true,
		MigrationsTable: schema + ".txoutbox_migrations", Logger: silent}); err != nil {
		log.Fatal(err)
	}
	outbox, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Table: table, Logger: silent})
	if err != nil {
		log.Fatal(err)
	}
	requireAdmin := func(next http.Handler) http.Handler { // the application's own auth
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Admin") != "yes" {
				http.Error(w, "forbidden", http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
		})
	}

	// README: console-mount
	ops, err := console.New(outbox, console.Options{
		Prefix: "/ops/outbox", Title: "orders",
		// Who did what, in the action log, from the application's auth.
		User: func(r *http.Request) string { return r.Header.Get("X-User") },
	})
	if err != nil {
		log.Fatal(err)
	}
	go ops.Run(ctx) //nolint:errcheck // samples the charts until ctx ends
	mux := http.NewServeMux()
	mux.Handle("/ops/outbox/", requireAdmin(http.StripPrefix("/ops/outbox", ops)))
	// README: end

	srv := httptest.NewServer(mux)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/ops/outbox/", nil)
	req.Header.Set("X-Admin", "yes")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, strings.Contains(string(body), `href="/ops/outbox/dead"`))
	// Output: 200 true
}
