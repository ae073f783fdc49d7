package pgxinbox_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	pgxoutbox "github.com/txoutbox/txoutbox/adapters/pgx"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox/pgxinbox"
)

// The same event delivered twice takes effect once: the handler's write
// and the inbox record share one pgx.Tx. (With a Watermill router, wrap the
// inbox in inbox.NewMiddleware instead of calling Process.) The example
// runs in a schema of its own in the database of $TXOUTBOX_PG_DSN.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("TXOUTBOX_PG_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := "pgxinbox_example_" + strconv.Itoa(os.Getpid())
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck
	if err := pgxoutbox.Migrate(ctx, pool, dialect.MigrateOptions{SkipOutbox: true, InboxTable: schema + ".processed_events",
		MigrationsTable: schema + ".txoutbox_migrations", Logger: slog.New(slog.DiscardHandler)}); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".stock (sku TEXT PRIMARY KEY, qty INT NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+schema+".stock VALUES ('apple', 100)"); err != nil {
		log.Fatal(err)
	}
	ib, err := pgxinbox.New(pool, pgxinbox.Options{Table: schema + ".processed_events"})
	if err != nil {
		log.Fatal(err)
	}
	takeOne := func(ctx context.Context) error {
		_, err := pgxinbox.Tx(ctx).Exec(ctx, "UPDATE "+schema+".stock SET qty = qty - 1 WHERE sku = 'apple'")
		return err
	}
	for range 2 {
		processed, err := ib.Process(ctx, "inventory", "01936f2e-0000-7000-8000-000000000001", takeOne)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("processed:", processed)
	}
	var qty int
	if err := pool.QueryRow(ctx, "SELECT qty FROM "+schema+".stock").Scan(&qty); err != nil {
		log.Fatal(err)
	}
	fmt.Println("stock:", qty)
	// Output:
	// processed: true
	// processed: false
	// stock: 99
}
