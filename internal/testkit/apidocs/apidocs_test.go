package apidocs

import (
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// root is the module's root, from this package's folder.
const root = "../../.."

// api is what one package declares at the top level: its exported names,
// and for each exported type the names of its methods and fields.
type api struct {
	names   map[string]bool
	members map[string]map[string]bool // type -> methods and fields
}

// loadAPIs parses every non-main, non-test package of the module, keyed by
// package name (the qualifier prose uses: core, sqlxoutbox, outboxtest).
func loadAPIs(t *testing.T) map[string]*api {
	apis := map[string]*api{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := f.Name.Name
		if pkg == "main" {
			return nil
		}
		a := apis[pkg]
		if a == nil {
			a = &api{names: map[string]bool{}, members: map[string]map[string]bool{}}
			apis[pkg] = a
		}
		member := func(typ, name string) {
			if a.members[typ] == nil {
				a.members[typ] = map[string]bool{}
			}
			a.members[typ][name] = true
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					a.names[d.Name.Name] = true
					continue
				}
				if typ := recvType(d.Recv.List[0].Type); typ != "" {
					member(typ, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							a.names[n.Name] = true
						}
					case *ast.TypeSpec:
						a.names[s.Name.Name] = true
						if a.members[s.Name.Name] == nil {
							a.members[s.Name.Name] = map[string]bool{}
						}
						for _, m := range fieldsOf(s.Type) {
							member(s.Name.Name, m)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return apis
}

func recvType(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return recvType(x.X)
	case *ast.IndexExpr:
		return recvType(x.X)
	case *ast.Ident:
		return x.Name
	}
	return ""
}

// fieldsOf lists a struct's fields and an interface's methods, with the
// names of embedded ones.
func fieldsOf(e ast.Expr) []string {
	var list *ast.FieldList
	switch x := e.(type) {
	case *ast.StructType:
		list = x.Fields
	case *ast.InterfaceType:
		list = x.Methods
	default:
		return nil
	}
	var names []string
	for _, f := range list.List {
		for _, n := range f.Names {
			names = append(names, n.Name)
		}
		if len(f.Names) == 0 {
			names = append(names, embeddedName(f.Type))
		}
	}
	return names
}

func embeddedName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return embeddedName(x.X)
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.Ident:
		return x.Name
	}
	return ""
}

// qualified matches pkg.Name and pkg.Type.Member.
var qualified = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?`)

// proseOf returns the text to check of each file: Markdown whole, Go files'
// comments only (code is checked by the compiler). CHANGELOG.md names the
// API that was, in its "Before" snippets and its lists of what is gone, so
// it is left out.
func proseOf(t *testing.T) map[string]string {
	texts := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && strings.HasPrefix(n, ".") {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(path, ".md") && filepath.Base(path) != "CHANGELOG.md":
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			texts[path] = string(b)
		case strings.HasSuffix(path, ".go"):
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			var sb strings.Builder
			for _, cg := range f.Comments {
				sb.WriteString(cg.Text())
				sb.WriteByte('\n')
			}
			texts[path] = sb.String()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return texts
}

// Every pkg.Name the prose writes, where pkg is a package of the module,
// names something that package declares; pkg.Type.Member a method or
// field of that type. A renamed or removed API left in a doc fails here.
func TestProseNamesTheAPI(t *testing.T) {
	t.Parallel()
	apis := loadAPIs(t)
	var bad []string
	for path, text := range proseOf(t) {
		rel, _ := filepath.Rel(root, path)
		for _, m := range qualified.FindAllStringSubmatch(text, -1) {
			a, ok := apis[m[1]]
			if !ok {
				continue // another package's name (http.Handler, sql.DB)
			}
			switch {
			case !a.names[m[2]]:
				bad = append(bad, rel+": "+m[1]+"."+m[2])
			case m[3] != "" && a.members[m[2]] != nil && !a.members[m[2]][m[3]] && !promoted(apis, a, m[2], m[3]):
				bad = append(bad, rel+": "+m[0])
			}
		}
	}
	sort.Strings(bad)
	for _, b := range compact(bad) {
		t.Errorf("names what its package does not declare: %s", b)
	}
}

// camel matches a Go-like name with an inner capital (RelayOptions,
// ExecWithEvents, SQLite): what prose writes when it means an
// identifier.
var camel = regexp.MustCompile(`\b(?:[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*|[A-Z]{2,}[a-z]{2,}[A-Za-z0-9]*)\b`)

// outside are names prose may use that the module's code never spells:
// other projects' APIs and names of things that are not identifiers.
var outside = map[string]bool{
	"OpenTelemetry": true, "W3C": true, // products and standards
	"SyncProducer": true, "RecordBatch": true, // sarama, Kafka
	"PoisonQueue": true, "ConnectionWrapper": true, "IsConnected": true, // watermill, amqp
	"DefaultRegisterer": true, "ConsumeWithContext": true, "OpenDBFromPool": true, // prometheus, amqp091, pgx
	"UpdateColumn": true, "BeforeCreate": true, "AutoMigrated": true, // GORM
	"CrossOriginProtection": true,                                           // net/http
	"TestOutage":            true, "TestMyStore": true, "CreateOrder": true, // test-name patterns (TestOutage*, BenchmarkCreateOrder)
	"AppendCertsFromPEM": true,                                // crypto/x509
	"SIGKILLed":          true,                                // a word
	"RawClaimMark":       true,                                // BenchmarkRawClaimMark
	"EventBridge":        true,                                // a product
	"MessageReader":      true, "MessageMetadataReader": true, // the CloudEvents SDK's binding interfaces
	// The alerting rules of docs/operations.md.
	"OutboxDeadLetters": true, "OutboxLagging": true, "OutboxPublishFailing": true, "OutboxRelayDown": true, "OutboxVeryOld": true,
}

// An identifier-like name in a Go comment or in the code of a Markdown page
// is spelled somewhere in the module's code (or listed in outside): a doc
// that names a function since renamed or removed fails here, even
// unqualified (the inbox's package doc named its pre-v1 constructor).
func TestProseNamesExist(t *testing.T) {
	t.Parallel()
	idents := codeIdents(t)
	var bad []string
	for path, text := range proseOf(t) {
		rel, _ := filepath.Rel(root, path)
		if strings.HasSuffix(path, ".md") {
			text = strings.Join(codeSpan.FindAllString(text, -1), "\n")
		}
		for _, w := range camel.FindAllString(text, -1) {
			if !idents[w] && !outside[w] {
				bad = append(bad, rel+": "+w)
			}
		}
	}
	sort.Strings(bad)
	for _, b := range compact(bad) {
		t.Errorf("names what no code spells: %s", b)
	}
}

// codeSpan matches Markdown's fenced blocks and inline code.
var codeSpan = regexp.MustCompile("(?s)```.*?```|`[^`\n]+`")

// codeIdents returns every identifier the module's Go code spells (its
// own declarations and the names it uses of other packages), and the
// identifier-like words of its string literals.
func codeIdents(t *testing.T) map[string]bool {
	ids := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && strings.HasPrefix(n, ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		var s scanner.Scanner
		s.Init(fset.AddFile(path, -1, len(src)), src, nil, 0)
		for {
			_, tok, lit := s.Scan()
			if tok == token.EOF {
				return nil
			}
			switch tok {
			case token.IDENT:
				ids[lit] = true
			case token.STRING:
				// Product names (PostgreSQL, InnoDB) are spelled in
				// messages, not as identifiers.
				for _, w := range camel.FindAllString(lit, -1) {
					ids[w] = true
				}
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// promoted reports whether member reaches typ through a field embedded in
// it, which is how a.members does not see it.
func promoted(apis map[string]*api, a *api, typ, member string) bool {
	for emb := range a.members[typ] {
		if ms, ok := a.members[emb]; ok && emb != typ && (ms[member] || promoted(apis, a, emb, member)) {
			return true
		}
	}
	return false
}

func compact(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
