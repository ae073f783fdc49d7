package main

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// snippets returns the regions of the file between "// README: name" and
// "// README: end", by name, with their common indentation removed.
func snippets(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var name string
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		l := sc.Text()
		trim := strings.TrimSpace(l)
		switch {
		case trim == "// README: end":
			out[name] = dedent(lines)
			name, lines = "", nil
		case strings.HasPrefix(trim, "// README: "):
			name = strings.TrimPrefix(trim, "// README: ")
		case name != "":
			lines = append(lines, l)
		}
	}
	return out
}

func dedent(lines []string) string {
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	indent := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		n := len(l) - len(strings.TrimLeft(l, "\t"))
		if indent < 0 || n < indent {
			indent = n
		}
	}
	for i, l := range lines {
		if len(l) >= indent && indent > 0 {
			lines[i] = l[indent:]
		}
	}
	return strings.Join(lines, "\n")
}

var snippetRE = regexp.MustCompile("(?s)<!-- snippet: ([a-z-]+) -->\n```go\n(.*?)\n```")

// pages are the README and the guide under docs/, which show the
// examples' regions.
func pages(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range append([]string{"../../README.md"}, files...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(f, "../../")] = string(b)
	}
	return out
}

// The README and the docs show the code of these programs exactly: a
// snippet edited in one place and not the other fails here, and so does a
// region that no page shows.
func TestREADMEShowsThisCode(t *testing.T) {
	t.Parallel()
	code := snippets(t, "main.go")
	for _, file := range []string{"conformance_test.go", "../pgx-orders/main.go", "../../logrelay/example_test.go", "../../binlogrelay/example_test.go", "../../console/example_test.go", "../../brokers/nats/example_test.go", "../../adapters/memory/example_test.go"} {
		for name, text := range snippets(t, file) {
			code[name] = text
		}
	}
	shown := map[string]bool{}
	for page, text := range pages(t) {
		for _, m := range snippetRE.FindAllStringSubmatch(text, -1) {
			name, block := m[1], m[2]
			shown[name] = true
			want, ok := code[name]
			if !ok {
				t.Errorf("%s: snippet %q has no region in examples/readme, examples/pgx-orders or the examples of logrelay, binlogrelay, console, brokers/nats and adapters/memory", page, name)
				continue
			}
			if block != want {
				t.Errorf("%s: snippet %q differs from its region in the examples:\n--- page\n%s\n--- code\n%s", page, name, block, want)
			}
		}
	}
	for name := range code {
		if !shown[name] {
			t.Errorf("region %q of the examples is on no page (README.md, docs/)", name)
		}
	}
}

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
)

// anchor is the fragment the usual Markdown renderers give a heading: lower case, spaces to
// dashes, punctuation other than dashes and underscores dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Every relative link of the README and the docs reaches a file of the
// repository, and its #fragment a heading of that file.
func TestPagesLinksResolve(t *testing.T) {
	t.Parallel()
	all := pages(t)
	for page, text := range all {
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			target, frag, _ := strings.Cut(link, "#")
			file := page
			if target != "" {
				file = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(page), target)))
				if _, err := os.Stat(filepath.Join("../..", file)); err != nil {
					t.Errorf("%s: link %s: %s does not exist", page, link, file)
					continue
				}
			}
			if frag == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			body, ok := all[file]
			if !ok {
				b, err := os.ReadFile(filepath.Join("../..", file))
				if err != nil {
					t.Errorf("%s: link %s: %v", page, link, err)
					continue
				}
				body = string(b)
			}
			found := false
			for _, h := range headingRE.FindAllStringSubmatch(body, -1) {
				if anchor(h[1]) == frag {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s: link %s: %s has no heading #%s", page, link, file, frag)
			}
		}
	}
}

// The README's sqlx producer, relay to RabbitMQ and inbox consumer, run.
func TestREADMEFlow(t *testing.T) {
	t.Parallel()
	res, err := run(t.Context(), testenv.PostgresDSN(t), testenv.AMQPURL(t), "readme-"+testenv.RandomSuffix())
	if err != nil {
		t.Fatal(err)
	}
	if res.stock != 99 || res.duplicates != 1 {
		t.Fatalf("%+v: want the stock decremented once and the redelivery absorbed", res)
	}
}

// The README's GORM flow, run.
func TestREADMEGORM(t *testing.T) {
	t.Parallel()
	rec := outboxtest.NewRecorder()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := runGORM(ctx, testenv.PostgresDSN(t), rec); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "both events published", func() (bool, any) { n := rec.Distinct(); return n >= 2, n })
	rec.RequirePublished(t, "order.noted", map[string]string{"note": "gift"})
	rec.RequirePublished(t, "order.created", nil)
}
