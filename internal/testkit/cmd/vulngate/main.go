// Command vulngate reads govulncheck's JSON output (-format json) on stdin
// and decides what fails the build: a vulnerability that the code calls in
// a module of go.mod fails it (upgrade the module); one in the standard
// library is reported, naming the Go release that fixes it, without failing,
// since the Go of the machine is not the module's to choose. A scan at the
// package level (-scan package, make test's) cannot tell whether a function
// is called, so there a vulnerable package that the code imports from a
// module fails. It prints one line per vulnerability.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

type finding struct {
	OSV          string `json:"osv"`
	FixedVersion string `json:"fixed_version"`
	Trace        []struct {
		Module   string `json:"module"`
		Version  string `json:"version"`
		Package  string `json:"package"`
		Function string `json:"function"`
	} `json:"trace"`
}

type message struct {
	Config *struct {
		ScanLevel string `json:"scan_level"`
	} `json:"config"`
	Finding *finding `json:"finding"`
}

func main() {
	code, err := gate(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vulngate:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

type vuln struct {
	id, module, version, fixed string
	imported, called           bool
}

func gate(r io.Reader, w io.Writer) (int, error) {
	dec := json.NewDecoder(r)
	byKey := map[string]*vuln{}
	packageLevel := false
	for {
		var m message
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("read govulncheck's output: %w", err)
		}
		if m.Config != nil {
			packageLevel = m.Config.ScanLevel == "package"
		}
		f := m.Finding
		if f == nil || len(f.Trace) == 0 {
			continue
		}
		t := f.Trace[0]
		key := f.OSV + " " + t.Module
		v := byKey[key]
		if v == nil {
			v = &vuln{id: f.OSV, module: t.Module, version: t.Version, fixed: f.FixedVersion}
			byKey[key] = v
		}
		v.imported = v.imported || t.Package != ""
		v.called = v.called || t.Function != ""
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	failed := 0
	for _, k := range keys {
		v := byKey[k]
		switch {
		case packageLevel && v.imported && v.module != "stdlib":
			failed++
			fmt.Fprintf(w, "vulncheck: FAIL %s in %s@%s: imported (a package-level scan cannot tell whether it is called: upgrade to %s)\n", v.id, v.module, v.version, v.fixed)
		case !v.called:
			fmt.Fprintf(w, "vulncheck: %s in %s@%s: imported, not called (fixed in %s)\n", v.id, v.module, v.version, v.fixed)
		case v.module == "stdlib":
			fmt.Fprintf(w, "vulncheck: %s in the standard library of %s: called; fixed in Go %s (not a failure: the machine's Go is not the module's to choose)\n", v.id, v.version, v.fixed)
		default:
			failed++
			fmt.Fprintf(w, "vulncheck: FAIL %s in %s@%s: called; upgrade to %s\n", v.id, v.module, v.version, v.fixed)
		}
	}
	fmt.Fprintf(w, "vulncheck: %d vulnerabilities found, %d failing\n", len(keys), failed)
	if failed > 0 {
		return 1, nil
	}
	return 0, nil
}
