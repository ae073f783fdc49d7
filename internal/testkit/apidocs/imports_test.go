package apidocs

import (
	"os/exec"
	"strings"
	"testing"
)

// under reports whether the package rel (relative to the module) is tree
// or in it.
func under(rel, tree string) bool { return rel == tree || strings.HasPrefix(rel, tree+"/") }

// TestProductionImportsNoTestkit fails if a production package imports
// test infrastructure (its _test.go files may): internal/testkit, the
// project's own, is imported only by the test trees (itself and testing/,
// the conformance kit that users' tests import); testing/ only by them and
// examples/ (the quickstart shows a flaky broker with its Faulty). The
// library and the CLI carry no test helper into users' builds.
func TestProductionImportsNoTestkit(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	modOut, err := exec.Command("go", "list", "-m").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	module := strings.TrimSpace(string(modOut)) + "/"
	packages, edges := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, ok := strings.CutPrefix(fields[0], module)
		if !ok || under(pkg, "internal/testkit") {
			continue
		}
		if under(pkg, "testing") {
			continue
		}
		example := under(pkg, "examples")
		packages++
		for _, imp := range fields[1:] {
			rel, ok := strings.CutPrefix(imp, module)
			if ok && (under(rel, "internal/testkit") || !example && under(rel, "testing")) {
				edges++
				t.Errorf("production package %s imports test infrastructure %s", pkg, rel)
			}
		}
	}
	if packages == 0 {
		t.Fatal("go list found no production package")
	}
	t.Logf("%d production packages, %d imports of test infrastructure", packages, edges)
}
