package main

import (
	"strings"
	"testing"
)

func TestGate(t *testing.T) {
	in := `{"config":{}}
{"finding":{"osv":"GO-1","fixed_version":"v1.26.9","trace":[{"module":"stdlib","version":"v1.26.8","package":"net/http","function":"Get"}]}}
{"finding":{"osv":"GO-2","fixed_version":"v0.60.0","trace":[{"module":"golang.org/x/net","version":"v0.59.0","package":"golang.org/x/net/http2"}]}}
`
	var out strings.Builder
	code, err := gate(strings.NewReader(in), &out)
	if err != nil || code != 0 || !strings.Contains(out.String(), "fixed in Go v1.26.9") || !strings.Contains(out.String(), "not called") {
		t.Fatalf("stdlib and uncalled only: code %d, %v\n%s", code, err, out.String())
	}
	in += `{"finding":{"osv":"GO-3","fixed_version":"v1.2.0","trace":[{"module":"example.com/m","version":"v1.1.0","package":"example.com/m","function":"F"}]}}
`
	out.Reset()
	if code, _ := gate(strings.NewReader(in), &out); code != 1 || !strings.Contains(out.String(), "FAIL GO-3") {
		t.Fatalf("a called module vulnerability must fail: code %d\n%s", code, out.String())
	}
}

func TestGatePackageLevel(t *testing.T) {
	// At the package level no finding names a function: an imported
	// package of a module fails, the standard library's and a module
	// that is required but not imported do not.
	in := `{"config":{"scan_level":"package"}}
{"finding":{"osv":"GO-1","fixed_version":"v1.26.9","trace":[{"module":"stdlib","version":"v1.26.8","package":"net/http"}]}}
{"finding":{"osv":"GO-2","fixed_version":"v0.60.0","trace":[{"module":"golang.org/x/net","version":"v0.59.0"}]}}
`
	var out strings.Builder
	if code, err := gate(strings.NewReader(in), &out); err != nil || code != 0 {
		t.Fatalf("stdlib and a module not imported: code %d, %v\n%s", code, err, out.String())
	}
	in += `{"finding":{"osv":"GO-3","fixed_version":"v1.2.0","trace":[{"module":"example.com/m","version":"v1.1.0","package":"example.com/m"}]}}
`
	out.Reset()
	if code, _ := gate(strings.NewReader(in), &out); code != 1 || !strings.Contains(out.String(), "FAIL GO-3") {
		t.Fatalf("an imported module vulnerability must fail at the package level: code %d\n%s", code, out.String())
	}
}
