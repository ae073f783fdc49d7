package main

import (
	"os"
	"strings"
	"testing"
)

// The wrapper passes the exit code through and logs the child's CPU; the
// report sums a package's lines and ranks the packages.
func TestRunAndReport(t *testing.T) {
	log := t.TempDir() + "/cpu.log"
	t.Setenv("TXOUTBOX_CPU_LOG", log)
	if code := run("/bin/sh", []string{"-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exit 3"}); code != 3 {
		t.Fatalf("exit code %d, want 3", code)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(string(b)); len(f) != 3 {
		t.Fatalf("log line %q, want directory, user and system seconds", b)
	}

	var out strings.Builder
	report(strings.NewReader("/r/a 1.0 0.5\n/r/b 3.0 1.0\n/r/a 2.0 1.0\nbroken line\n"), &out, "/r", 10)
	got := out.String()
	ia, ib := strings.Index(got, "  a\n"), strings.Index(got, "  b\n")
	if ia < 0 || ib < 0 || ib < ia || !strings.Contains(got, "4.5s  (user 3.0s, sys 1.5s)  a") || !strings.Contains(got, "9s in all") {
		t.Fatalf("report:\n%s", got)
	}
}
