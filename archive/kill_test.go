package archive_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"gocloud.dev/blob/fileblob"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/archive"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/testing/sqlfixture"
)

// TestKilledArchiverLosesNothing runs the archiver in a child process that
// SIGKILLs itself at each point where work is half done (its second batch,
// so one batch is complete), then archives the rest here: every event is
// in the archive once, and the table is empty.
func TestKilledArchiverLosesNothing(t *testing.T) {
	if os.Getenv("ARCHIVE_CHILD_POINT") != "" {
		runKilledChild(t)
		return
	}
	t.Parallel()
	for _, point := range crashPoints {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := testenv.PostgresDSN(t)
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			fx := sqlfixture.New(t, db, dialect.Postgres, sqlfixture.Options{SkipInbox: true})
			ob, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Dialect: dialect.Postgres})
			if err != nil {
				t.Fatal(err)
			}
			o := &outbox{db: db, d: dialect.Postgres, table: fx.Dialect.Quote(fx.Table), name: fx.Table.String(), ob: ob}
			ids := o.produce(t, 150)
			o.publishAll(t)
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0], "-test.run=^TestKilledArchiverLosesNothing$", "-test.count=1")
			cmd.Env = append(os.Environ(), "ARCHIVE_CHILD_POINT="+point, "ARCHIVE_CHILD_DSN="+dsn, "ARCHIVE_CHILD_DIR="+dir)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child was not killed at %s: %v\n%s", point, err, out)
			}
			b, err := fileblob.OpenBucket(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			a, err := archive.New(ob, b, archive.Options{BatchSize: 50})
			if err != nil {
				t.Fatal(err)
			}
			// The killed child's lock goes with its connection, once the
			// server has seen the connection close: a moment after the kill.
			wait.For(t, "the killed archiver's lock to go", func() (bool, any) {
				_, err := a.ArchiveBefore(ctx, time.Now().Add(time.Minute), nil)
				if err != nil && !errors.Is(err, archive.ErrLocked) {
					t.Fatal(err)
				}
				return err == nil, err
			})
			if n := o.count(t, "1=1"); n != 0 {
				t.Fatalf("%d rows left", n)
			}
			if got := archived(t, b, ""); !slices.Equal(idsOf(got), ids) {
				t.Fatalf("archive holds %d events, want the 150 in order", len(got))
			}
			if objects, events := manifestTotal(t, b, ""); objects != 3 || events != 150 {
				t.Fatalf("%d objects, %d events: a second copy was written", objects, events)
			}
		})
	}
}

func runKilledChild(t *testing.T) {
	point := os.Getenv("ARCHIVE_CHILD_POINT")
	db, err := sql.Open("pgx", os.Getenv("ARCHIVE_CHILD_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	ob, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Dialect: dialect.Postgres})
	if err != nil {
		t.Fatal(err)
	}
	b, err := fileblob.OpenBucket(os.Getenv("ARCHIVE_CHILD_DIR"), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := archive.New(ob, b, archive.Options{BatchSize: 50})
	if err != nil {
		t.Fatal(err)
	}
	hits := 0
	archive.SetCrash(a, func(p string) error {
		if p == point {
			if hits++; hits == 2 {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
		return nil
	})
	_, err = a.ArchiveBefore(context.Background(), time.Now().Add(time.Minute), nil)
	t.Fatalf("the child was not killed at %s: %v", point, err)
}
