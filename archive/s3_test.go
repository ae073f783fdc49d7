package archive_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/s3blob"

	"github.com/txoutbox/txoutbox/archive"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
)

// TestArchiveToS3 runs the archive against the S3-protocol server that
// make test starts (gofakes3, through s3blob and the AWS SDK): objects are
// written, read back and verified there, a step killed before its delete
// is finished by the next run without a second copy, and the archive reads
// back whole.
func TestArchiveToS3(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, err := blob.OpenBucket(ctx, testenv.Env(t, "TXOUTBOX_S3_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	prefix := "test-" + testenv.RandomSuffix()
	o := openOutbox(t, "postgres")
	ids := o.produce(t, 500)
	o.publishAll(t)
	a, err := archive.New(o.ob, b, archive.Options{BatchSize: 200, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	killed := errors.New("killed")
	archive.SetCrash(a, func(p string) error {
		if p == "before-delete" {
			return killed
		}
		return nil
	})
	cutoff := time.Now().Add(time.Minute)
	if _, err := a.ArchiveBefore(ctx, cutoff, nil); !errors.Is(err, killed) {
		t.Fatal(err)
	}
	archive.SetCrash(a, nil)
	res, err := a.ArchiveBefore(ctx, cutoff, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Reused != 1 || res.Objects != 2 || res.Deleted != 500 {
		t.Fatalf("result %+v: want the killed batch's object reused, two more written, 500 deleted", res)
	}
	if got := archived(t, b, prefix); !slices.Equal(idsOf(got), ids) {
		t.Fatalf("the S3 archive holds %d events, want the 500 in order", len(got))
	}
	if objects, events := manifestTotal(t, b, prefix); objects != 3 || events != 500 {
		t.Fatalf("%d objects, %d events in S3", objects, events)
	}
}
