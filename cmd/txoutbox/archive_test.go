package main

import (
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"gocloud.dev/secrets/localsecrets"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/seal"
)

// TestArchiveAndReplayFromIt: archive moves published events to a bucket
// (file:// and the S3 server make test starts) with a progress line, and
// replay --from publishes the selected ones again with their IDs, without
// the database.
func TestArchiveAndReplayFromIt(t *testing.T) {
	t.Parallel()
	for _, bucket := range []string{"file", "s3"} {
		t.Run(bucket, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			created := f.enqueue(t, "order.created", "a1", 3)
			paid := f.enqueue(t, "order.paid", "a2", 2)
			ok(t, f.dsn, "relay", "--broker", "memory://", "--drain", "--http-addr", "")
			url := "file://" + filepath.Join(t.TempDir(), "archive") + "?create_dir=true"
			prefix := ""
			if bucket == "s3" {
				url = testenv.Env(t, "TXOUTBOX_S3_URL")
				prefix = "cli-" + testenv.RandomSuffix()
			}
			r := ok(t, f.dsn, "archive", "--to", url, "--prefix", prefix, "--retention", "1ns")
			if !strings.Contains(r.stdout, "archived 5 event(s)") || !strings.Contains(r.stderr, "archived 5 of 5 (100%) events") {
				t.Fatalf("archive:\nstdout: %s\nstderr: %s", r.stdout, r.stderr)
			}
			if n := f.count(t, "1=1"); n != 0 {
				t.Fatalf("%d rows left after archive", n)
			}
			// No --dsn: replay from the archive needs none.
			r = run(t, "", nil, "replay", "--from", url, "--prefix", prefix, "--broker", "log://", "--type", "order.paid")
			if r.code != 0 || !strings.Contains(r.stderr, "replayed 2 of 2 (100%) events") {
				t.Fatalf("replay --from: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
			}
			got := sinkIDs(t, r.stdout)
			if len(got) != 2 || got[0] != paid[0].ID || got[1] != paid[1].ID {
				t.Fatalf("replay --from published %v, want the two order.paid events in order", got)
			}
			r = run(t, "", nil, "replay", "--from", url, "--prefix", prefix, "--broker", "log://", "--all", "--yes")
			if got := sinkIDs(t, r.stdout); r.code != 0 || len(got) != 5 || got[0] != created[0].ID {
				t.Fatalf("replay --from --all: exit %d, %d events\n%s", r.code, len(got), r.stderr)
			}
		})
	}
}

// TestArchiveUsage: bad bucket URLs and options are usage errors that
// name the problem, before anything is written.
func TestArchiveUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"archive", "--dsn", "sqlite:x.db"}, "--to needs a bucket URL"},
		{[]string{"archive", "--to", "ftp://x", "--dsn", "sqlite:x.db"}, "want a file:// or s3:// URL"},
		{[]string{"archive", "--to", "file:///tmp", "--batch-size", "0", "--dsn", "sqlite:x.db"}, "--batch-size"},
		{[]string{"replay", "--from", "file:///nonexistent-txoutbox", "--all", "--yes"}, "no broker"},
		{[]string{"relay", "--archive-to", "file:///tmp", "--broker", "log://", "--dsn", "sqlite:x.db"}, "--archive-to needs --cleanup-interval"},
		{[]string{"relay", "--archive-to", "file:///tmp", "--cleanup-interval", "1h", "--delete-on-publish", "--broker", "log://", "--dsn", "sqlite:x.db"}, "nothing to archive"},
		{[]string{"relay", "--keeper", "nourl", "--broker", "log://", "--dsn", "sqlite:x.db"}, "want ID=URL"},
	} {
		r := run(t, "", nil, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("txoutbox %v: exit %d, stderr %q; want usage error %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

// TestSealedEventsInTheCLI: dead list shows a sealed payload as encrypted
// (with its key ID) unless --keeper opens it, the relay with --keeper
// publishes plaintext, and the key never appears in any output.
func TestSealedEventsInTheCLI(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	raw, err := localsecrets.NewRandomKey()
	if err != nil {
		t.Fatal(err)
	}
	keyURL := "base64key://" + base64URL(raw[:])
	k := localsecrets.NewKeeper(raw)
	defer k.Close()
	s, err := seal.New(seal.Options{Key: seal.Key{ID: "k1", Keeper: k}})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := sqlxoutbox.NewDB(f.db, sqlxoutbox.Options{Hooks: []core.EnqueueHook{s.Hook()}})
	if err != nil {
		t.Fatal(err)
	}
	f.ob = ob
	f.enqueue(t, "order.paid", "a1", 1)
	f.enqueue(t, "order.created", "a2", 2)
	r := ok(t, f.dsn, "relay", "--broker", "log://?fail_types=order.paid", "--max-attempts", "1", "--drain", "--http-addr", "", "--keeper", "k1="+keyURL)
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if strings.Contains(line, "txoutbox_sealed") || !strings.Contains(line, `"n":`) {
			t.Fatalf("relay with --keeper published %s, want plaintext", line)
		}
	}
	var dead []deadJSON
	r = ok(t, f.dsn, "dead", "list", "--format", "json")
	if err := json.Unmarshal([]byte(r.stdout), &dead); err != nil || len(dead) != 1 || dead[0].EncryptedWith != "k1" || string(dead[0].Payload) != "null" {
		t.Fatalf("dead list without the key: %v\n%s", err, r.stdout)
	}
	r = ok(t, f.dsn, "dead", "list", "--format", "json", "--keeper", "k1="+keyURL)
	dead = nil
	if err := json.Unmarshal([]byte(r.stdout), &dead); err != nil || dead[0].EncryptedWith != "" || !strings.Contains(string(dead[0].Payload), `"n"`) {
		t.Fatalf("dead list with the key: %v\n%s", err, r.stdout)
	}
	short := base64URL(raw[:16])
	r = run(t, "", nil, "relay", "--keeper", "k1=base64key://"+short, "--broker", "log://", "--dsn", f.dsn, "--drain", "--http-addr", "", "--log-level", "debug")
	if r.code != exitUsage || strings.Contains(r.stdout+r.stderr, short) {
		t.Fatalf("a bad key: exit %d, want a usage error that does not print it:\n%s", r.code, r.stderr)
	}
}

func base64URL(b []byte) string { return base64.URLEncoding.EncodeToString(b) }
