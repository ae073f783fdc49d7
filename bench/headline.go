package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

// headlineRow is a row of the README's comparison: its label there, and the
// start of the benchmark table's scenario it is taken from.
type headlineRow struct {
	label, scenario string
	// withValue also shows txoutbox's own figure beside the ratio (a
	// latency, which reads better as milliseconds too).
	withValue bool
}

// headline is the README's comparison: at most eight rows of the table,
// against the peers.
var headline = []headlineRow{
	{"relay drain vs hand-written claim+mark SQL", "a  relay drain vs raw SQL claim+mark", false},
	{"relay drain vs Watermill's SQL forwarder at its defaults, 200k backlog", "b  relay drain (batch 500, 2 workers) vs Watermill SQL forwarder at its defaults, equal 200k backlog", false},
	{"relay drain vs River at its defaults, 200k backlog", "r  drain of an equal 200k backlog, txoutbox (batch 500, 2 workers) vs River defaults", false},
	{"relay drain vs River tuned (as its own benchmark sets it)", "r  drain of an equal 200k backlog, txoutbox (batch 500, 2 workers) vs River tuned", false},
	{"end-to-end latency p99 at 1,000 events/s, in-process wake-up vs polling every 100 ms", "c  latency p99 at 1000/s, in-process wake (vs poll 100ms)", true},
	{"producer throughput with the event in the same statement (`ExecWithEvents`) vs without an outbox", "d  producer tx/s with the outbox row (ExecWithEvents: one statement) vs without (4 clients)", false},
	{"producer throughput, `Enqueue` vs River's `InsertTx`", "r  producer tx/s, order row + txoutbox Enqueue vs order row + River InsertTx", false},
	{"log mode vs Watermill's SQL forwarder, 200k backlog", "l  log-mode drain vs Watermill SQL forwarder at its defaults, 200k backlog", false},
}

// The README's comparison sits between these two lines; -readme rewrites
// what is between them.
const (
	headlineStart = "<!-- bench:headline: written by go run ./bench -readme README.md, from the run of docs/benchmarks.md -->"
	headlineEnd   = "<!-- /bench:headline -->"
)

// headlineTable returns the README's comparison taken from table, the
// benchmark's Markdown table (each label from the first row whose scenario
// starts with its own), or an error naming a row it lacks (a scenario
// renamed, or a run with -only that left it out).
func headlineTable(table string) (string, error) {
	var rows [][]string // the table's rows, in its order, split into cells
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "| ") {
			continue
		}
		if c := strings.Split(strings.Trim(line, "| "), " | "); len(c) >= 4 {
			rows = append(rows, c)
		}
	}
	var b strings.Builder
	b.WriteString("| scenario | ratio |\n|---|---|\n")
	for _, h := range headline {
		i := slices.IndexFunc(rows, func(c []string) bool { return strings.HasPrefix(c[0], h.scenario) })
		if i < 0 {
			return "", fmt.Errorf("the benchmark table has no row %q for the README's %q", h.scenario, h.label)
		}
		found := rows[i]
		ratio := found[3]
		if h.withValue {
			ratio += " (" + found[1] + ")"
		}
		fmt.Fprintf(&b, "| %s | %s |\n", h.label, ratio)
	}
	return b.String(), nil
}

// withHeadline returns readme with its comparison replaced by the one
// taken from table.
func withHeadline(readme, table string) (string, error) {
	start := strings.Index(readme, headlineStart)
	end := strings.Index(readme, headlineEnd)
	if start < 0 || end < start {
		return "", fmt.Errorf("the README has no comparison between %q and %q", headlineStart, headlineEnd)
	}
	t, err := headlineTable(table)
	if err != nil {
		return "", err
	}
	return readme[:start+len(headlineStart)] + "\n" + t + readme[end:], nil
}

// writeHeadline rewrites the comparison of the README at path from table.
func writeHeadline(path, table string) error {
	readme, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := withHeadline(string(readme), table)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(out), 0o644)
}
