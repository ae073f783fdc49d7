// Command testreport reads `go test -json` on stdin and prints what a plain
// `go test` prints (each package's ok or FAIL line, and the output of the
// tests that failed), then the slowest tests and packages of the run, so
// that the next slowdown is seen when it lands. It exits 1 when a test or a package
// failed, or when the stream ended without a package result (a build
// failure, a killed go test).
//
//	go test -json ./... | go run ./internal/testkit/cmd/testreport -top 10
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// timing is one top-level test's duration: from its start to the end of
// the last of its subtests, which for parallel subtests is long after the
// test function itself returned.
type timing struct {
	pkg, test  string
	start, end time.Time
	elapsed    float64 // go test's own, the floor
}

func (t *timing) seconds() float64 {
	if span := t.end.Sub(t.start).Seconds(); span > t.elapsed {
		return span
	}
	return t.elapsed
}

// report is the run so far.
type report struct {
	out     io.Writer
	outputs map[string][]string // package + test -> its output lines
	timings map[string]*timing  // package + top-level test
	failed  bool
	pkgs    map[string]bool    // packages seen, and whether they ended
	elapsed map[string]float64 // package -> its test binaries' run time (summed over go test runs)
}

func newReport(out io.Writer) *report {
	return &report{out: out, outputs: map[string][]string{}, pkgs: map[string]bool{}, timings: map[string]*timing{}, elapsed: map[string]float64{}}
}

func (r *report) add(e event) {
	key := e.Package + "\x00" + e.Test
	if _, seen := r.pkgs[e.Package]; !seen && e.Package != "" {
		r.pkgs[e.Package] = false
	}
	if e.Test != "" {
		r.time(e)
	}
	switch e.Action {
	case "output":
		r.outputs[key] = append(r.outputs[key], e.Output)
	case "pass", "skip":
		if e.Test == "" {
			r.pkgs[e.Package] = true
			r.printPackage(e)
		}
		delete(r.outputs, key)
	case "fail":
		r.failed = true
		if e.Test == "" {
			r.pkgs[e.Package] = true
			// A package that failed outside any test (a build error,
			// TestMain, a panic) has its reason in its own output.
			for _, l := range r.outputs[key] {
				if !strings.HasPrefix(l, "FAIL") && !strings.HasPrefix(l, "ok ") {
					fmt.Fprint(r.out, l)
				}
			}
			r.printPackage(e)
		} else {
			for _, l := range r.outputs[key] {
				fmt.Fprint(r.out, l)
			}
		}
		delete(r.outputs, key)
	}
}

// time extends the span of e's top-level test.
func (r *report) time(e event) {
	top, _, _ := strings.Cut(e.Test, "/")
	key := e.Package + "\x00" + top
	t := r.timings[key]
	if t == nil {
		t = &timing{pkg: e.Package, test: top, start: e.Time, end: e.Time}
		r.timings[key] = t
	}
	if e.Time.After(t.end) {
		t.end = e.Time
	}
	if (e.Action == "pass" || e.Action == "fail") && e.Test == top {
		t.elapsed = e.Elapsed
	}
}

func (r *report) printPackage(e event) {
	// make test runs some packages twice (the outage tests apart):
	// their time is the sum.
	r.elapsed[e.Package] += e.Elapsed
	status := map[string]string{"pass": "ok  ", "fail": "FAIL", "skip": "?   "}[e.Action]
	if e.Action == "skip" {
		fmt.Fprintf(r.out, "%s\t%s\t[no test files]\n", status, e.Package)
		return
	}
	fmt.Fprintf(r.out, "%s\t%s\t%.3fs\n", status, e.Package, e.Elapsed)
}

// finish prints the slowest tests and reports whether the run passed.
func (r *report) finish(top int) bool {
	for pkg, ended := range r.pkgs {
		if !ended {
			r.failed = true
			fmt.Fprintf(r.out, "FAIL\t%s\t(no result: the test binary was killed or did not build)\n", pkg)
		}
	}
	ts := make([]*timing, 0, len(r.timings))
	for _, t := range r.timings {
		ts = append(ts, t)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].seconds() > ts[j].seconds() })
	if n := min(top, len(ts)); n > 0 {
		fmt.Fprintf(r.out, "\nThe %d slowest tests (start to the end of their last subtest):\n", n)
		for _, t := range ts[:n] {
			fmt.Fprintf(r.out, "%8.1fs  %s  %s\n", t.seconds(), strings.TrimPrefix(t.pkg, "github.com/txoutbox/txoutbox/"), t.test)
		}
	}
	// scripts/test.sh starts the longest packages first: this list is
	// where its order comes from.
	pkgs := make([]string, 0, len(r.elapsed))
	for p := range r.elapsed {
		pkgs = append(pkgs, p)
	}
	sort.Slice(pkgs, func(i, j int) bool { return r.elapsed[pkgs[i]] > r.elapsed[pkgs[j]] })
	if n := min(top, len(pkgs)); n > 0 {
		fmt.Fprintf(r.out, "\nThe %d slowest packages (their test binaries' run time, summed over go test runs):\n", n)
		for _, p := range pkgs[:n] {
			fmt.Fprintf(r.out, "%8.1fs  %s\n", r.elapsed[p], strings.TrimPrefix(p, "github.com/txoutbox/txoutbox/"))
		}
	}
	return !r.failed
}

func run(in io.Reader, out io.Writer, top int) (bool, error) {
	r := newReport(out)
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// go test's own messages (build errors of a package with no
			// test files, say) are not JSON: pass them on.
			fmt.Fprintln(out, string(line))
			continue
		}
		r.add(e)
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	return r.finish(top), nil
}

func main() {
	top := flag.Int("top", 10, "how many of the slowest tests to list")
	flag.Parse()
	ok, err := run(os.Stdin, os.Stdout, *top)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}
