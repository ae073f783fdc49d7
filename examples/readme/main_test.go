package main

import (
	"bufio"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"

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

// The README shows the code of this program exactly: a snippet edited in
// one place and not the other fails here.
func TestREADMEShowsThisCode(t *testing.T) {
	t.Parallel()
	code := snippets(t, "main.go")
	for _, file := range []string{"conformance_test.go", "../pgx-orders/main.go", "../../logrelay/example_test.go", "../../binlogrelay/example_test.go", "../../console/example_test.go", "../../brokers/nats/example_test.go", "../../adapters/memory/example_test.go"} {
		for name, text := range snippets(t, file) {
			code[name] = text
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	for _, m := range snippetRE.FindAllStringSubmatch(string(readme), -1) {
		name, block := m[1], m[2]
		shown[name] = true
		want, ok := code[name]
		if !ok {
			t.Errorf("README snippet %q has no region in examples/readme, examples/pgx-orders or the examples of logrelay, binlogrelay, console and brokers/nats", name)
			continue
		}
		if block != want {
			t.Errorf("README snippet %q differs from its region in the examples:\n--- README\n%s\n--- code\n%s", name, block, want)
		}
	}
	for name := range code {
		if !shown[name] {
			t.Errorf("region %q of the examples is not in the README", name)
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
