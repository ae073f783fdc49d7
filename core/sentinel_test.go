package core_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// No package of the module declares a sentinel of its own under the name
// of one of core's: one sentinel per meaning, wrapped (%w) where it is
// returned, so that errors.Is(err, core.ErrInvalidOptions) holds whichever
// package refused.
func TestOneSentinelPerMeaning(t *testing.T) {
	t.Parallel()
	coreNames := exportedErrVars(t, ".")
	if len(coreNames) < 5 {
		t.Fatalf("found only %d sentinels in core: %v", len(coreNames), coreNames)
	}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != ".." && (strings.HasPrefix(name, ".") || name == "core" && filepath.Dir(path) == "..") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		for name := range exportedErrVarsOfFile(t, path) {
			if coreNames[name] {
				t.Errorf("%s declares %s, which core declares: wrap core.%s instead", path, name, name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func exportedErrVars(t *testing.T, dir string) map[string]bool {
	names := map[string]bool{}
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			for n := range exportedErrVarsOfFile(t, f) {
				names[n] = true
			}
		}
	}
	return names
}

// exportedErrVarsOfFile returns the package-level exported variables of a
// file whose names start with Err.
func exportedErrVarsOfFile(t *testing.T, path string) map[string]bool {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.VAR {
			continue
		}
		for _, spec := range gd.Specs {
			for _, n := range spec.(*ast.ValueSpec).Names {
				if n.IsExported() && strings.HasPrefix(n.Name, "Err") {
					names[n.Name] = true
				}
			}
		}
	}
	return names
}
