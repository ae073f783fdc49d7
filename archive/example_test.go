package archive_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"gocloud.dev/blob/fileblob"
	_ "modernc.org/sqlite"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/archive"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// Archive the published events of an outbox to a directory, then publish
// them again from there. Here the database is SQLite and the bucket a
// local directory; an s3:// bucket is opened with blob.OpenBucket.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "txoutbox-archive-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "shop.db")+"?_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	silent := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := dialect.Migrate(ctx, db, dialect.SQLite, dialect.MigrateOptions{Logger: silent}); err != nil {
		log.Fatal(err)
	}
	store, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		ev, _ := core.NewEvent("order", fmt.Sprint(i), "order.created", map[string]int{"order": i})
		if err := store.Enqueue(ctx, tx, ev); err != nil {
			log.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	discard := core.PublisherFunc(func(context.Context, []core.Event) error { return nil })
	relay, err := core.NewRelay(store, discard, core.RelayOptions{Logger: silent})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.Drain(ctx); err != nil {
		log.Fatal(err)
	}

	bucket, err := fileblob.OpenBucket(filepath.Join(dir), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer bucket.Close()
	archiver, err := archive.New(store, bucket, archive.Options{Prefix: "orders", Logger: silent})
	if err != nil {
		log.Fatal(err)
	}
	// Archive takes what was published more than Retention ago; here,
	// everything published so far.
	res, err := archiver.ArchiveBefore(ctx, time.Now().Add(time.Second), nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("archived %d events in %d object, deleted %d rows\n", res.Events, res.Objects, res.Deleted)

	print := core.PublisherFunc(func(_ context.Context, evs []core.Event) error {
		for _, ev := range evs {
			fmt.Println("publish", ev.EventType, string(ev.Payload))
		}
		return nil
	})
	n, err := archive.Replay(ctx, archive.NewReader(bucket, "orders"), print,
		archive.Filter{AggregateType: "order", AggregateID: "2"}, archive.ReplayOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("replayed", n)
	// Output:
	// archived 3 events in 1 object, deleted 3 rows
	// publish order.created {"order":2}
	// replayed 1
}
