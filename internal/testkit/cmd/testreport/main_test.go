package main

import (
	"strings"
	"testing"
)

const stream = `{"Action":"start","Package":"example.com/a"}
{"Action":"run","Package":"example.com/a","Test":"TestFast"}
{"Action":"output","Package":"example.com/a","Test":"TestFast","Output":"=== RUN   TestFast\n"}
{"Action":"pass","Package":"example.com/a","Test":"TestFast","Elapsed":0.5}
{"Time":"2026-12-04T10:00:00Z","Action":"run","Package":"example.com/a","Test":"TestSlow"}
{"Time":"2026-12-04T10:00:09.5Z","Action":"pass","Package":"example.com/a","Test":"TestSlow","Elapsed":9.5}
{"Time":"2026-12-04T10:00:20Z","Action":"pass","Package":"example.com/a","Test":"TestSlow/parallel","Elapsed":10.5}
{"Action":"output","Package":"example.com/a","Output":"ok  \texample.com/a\t10.0s\n"}
{"Action":"pass","Package":"example.com/a","Elapsed":10}
{"Action":"run","Package":"example.com/b","Test":"TestBroken"}
{"Action":"output","Package":"example.com/b","Test":"TestBroken","Output":"    b_test.go:9: the reason\n"}
{"Action":"fail","Package":"example.com/b","Test":"TestBroken","Elapsed":2}
{"Action":"fail","Package":"example.com/b","Elapsed":2.1}
`

func TestReportPrintsFailuresAndTheSlowest(t *testing.T) {
	var out strings.Builder
	ok, err := run(strings.NewReader(stream), &out, 2)
	if err != nil || ok {
		t.Fatalf("ok %v, err %v: a failed test must fail the run", ok, err)
	}
	got := out.String()
	for _, want := range []string{
		"ok  \texample.com/a\t10.000s\n",
		"    b_test.go:9: the reason\n",
		"FAIL\texample.com/b\t2.100s\n",
		"The 2 slowest tests (start to the end of their last subtest):\n    20.0s  example.com/a  TestSlow\n     2.0s  example.com/b  TestBroken\n",
		"The 2 slowest packages (their test binaries' run time, summed over go test runs):\n    10.0s  example.com/a\n     2.1s  example.com/b\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "=== RUN") {
		t.Errorf("a passing test's output was printed:\n%s", got)
	}
}

func TestReportSumsAPackageRunTwice(t *testing.T) {
	var out strings.Builder
	twice := `{"Action":"pass","Package":"example.com/a","Elapsed":10}
{"Action":"pass","Package":"example.com/b","Elapsed":12}
{"Action":"pass","Package":"example.com/a","Elapsed":5}
`
	if _, err := run(strings.NewReader(twice), &out, 2); err != nil {
		t.Fatal(err)
	}
	if want := "The 2 slowest packages (their test binaries' run time, summed over go test runs):\n    15.0s  example.com/a\n    12.0s  example.com/b\n"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
}

func TestReportFailsAPackageWithoutResult(t *testing.T) {
	var out strings.Builder
	ok, _ := run(strings.NewReader(`{"Action":"run","Package":"example.com/c","Test":"TestX"}`+"\n"), &out, 10)
	if ok || !strings.Contains(out.String(), "FAIL\texample.com/c\t(no result") {
		t.Fatalf("ok %v:\n%s", ok, out.String())
	}
}

func TestReportPassesNonJSONLinesOn(t *testing.T) {
	var out strings.Builder
	ok, _ := run(strings.NewReader("# example.com/d\nd.go:1: syntax error\n"), &out, 10)
	if !ok || !strings.Contains(out.String(), "d.go:1: syntax error") {
		t.Fatalf("ok %v:\n%s", ok, out.String())
	}
}
