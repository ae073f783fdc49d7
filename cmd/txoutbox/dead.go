package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// deadSelector is the filter flags shared by dead list, retry and purge.
type deadSelector struct {
	ids        []string
	seqs       []int64
	eventType  string
	deadBefore string
	all        bool
}

func (s *deadSelector) flags(fs *pflag.FlagSet, withAll bool) {
	fs.StringSliceVar(&s.ids, "id", nil, "event ID (repeat or comma-separate for several)")
	fs.Int64SliceVar(&s.seqs, "seq", nil, "event Seq, as 'dead list' shows it (repeatable)")
	fs.StringVar(&s.eventType, "type", "", "event type")
	fs.StringVar(&s.deadBefore, "dead-before", "", "dead-lettered before this time: RFC 3339, or a duration ago (24h)")
	if withAll {
		fs.BoolVar(&s.all, "all", false, "every dead event (needed when no other selector is given)")
	}
}

func (s *deadSelector) filter(now time.Time) (dialect.DeadFilter, error) {
	f := dialect.DeadFilter{EventIDs: s.ids, Seqs: s.seqs, EventType: s.eventType, All: s.all}
	if s.deadBefore != "" {
		t, err := parseTime(s.deadBefore, now)
		if err != nil {
			return f, fmt.Errorf("%w: --dead-before: %w", ErrUsage, err)
		}
		f.DeadBefore = t
	}
	return f, nil
}

func (s *deadSelector) empty() bool {
	return len(s.ids) == 0 && len(s.seqs) == 0 && s.eventType == "" && s.deadBefore == ""
}

// describe says in words what the selector picks, for the confirmation.
func (s *deadSelector) describe() string {
	var parts []string
	if len(s.ids) > 0 {
		parts = append(parts, "id "+strings.Join(s.ids, ","))
	}
	if len(s.seqs) > 0 {
		parts = append(parts, fmt.Sprintf("seq %v", s.seqs))
	}
	if s.eventType != "" {
		parts = append(parts, "type "+s.eventType)
	}
	if s.deadBefore != "" {
		parts = append(parts, "dead before "+s.deadBefore)
	}
	if len(parts) == 0 {
		return "all"
	}
	return strings.Join(parts, " and ")
}

// requireSelector refuses an empty selection without --all, so that a
// forgotten flag never touches every dead event.
func (s *deadSelector) requireSelector(cmd string) error {
	if s.empty() && !s.all {
		return usagef("%s needs --id, --seq, --type, --dead-before or --all", cmd)
	}
	if !s.empty() && s.all {
		return usagef("%s: --all cannot be combined with other selectors", cmd)
	}
	return nil
}

// parseTime reads an RFC 3339 time, a date (2006-01-02, UTC), or a duration
// meaning that long before now.
func parseTime(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time, a date nor a duration", s)
}

func (a *app) deadCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead",
		Short: "Inspect, re-queue and purge dead-lettered events",
		Long: `An event is dead-lettered when it failed --max-attempts times: it stays in the
outbox with its last error, and the relay no longer tries it. The workflow:

  1. txoutbox stats                      notice dead > 0 (or the alert fires)
  2. txoutbox dead list                  see which events, and why (LAST ERROR)
  3. fix the cause (broker permissions, a consumer's schema, a topic)
  4. txoutbox dead retry --type T        re-queue them with a fresh budget of
                                         attempts; the running relay picks them up
  5. txoutbox dead purge --id ID         delete what must never be published
                                         (asks first; --yes for scripts)`,
		Example: `  txoutbox dead list
  txoutbox dead list --type order.paid --format json
  txoutbox dead retry --type order.paid
  txoutbox dead retry --id 0190c6d8-5a4e-7b1c-9f3e-2d8a1b6c4e5f
  txoutbox dead purge --dead-before 720h --yes`,
	}
	cmd.AddCommand(a.deadListCommand(), a.deadRetryCommand(), a.deadPurgeCommand())
	return cmd
}

// deadJSON is one event of dead list --format json.
type deadJSON struct {
	Seq           int64             `json:"seq"`
	ID            string            `json:"id"`
	EventType     string            `json:"event_type"`
	AggregateType string            `json:"aggregate_type,omitempty"`
	AggregateID   string            `json:"aggregate_id,omitempty"`
	CreatedAt     time.Time         `json:"created_at"`
	DeadAt        *time.Time        `json:"dead_at"`
	Attempts      int               `json:"attempts"`
	LastError     string            `json:"last_error"`
	Headers       map[string]string `json:"headers,omitempty"`
	Payload       json.RawMessage   `json:"payload"`
	// EncryptedWith is the key ID of a sealed payload shown without its
	// key (--keeper); Payload is then null.
	EncryptedWith string `json:"encrypted_with,omitempty"`
}

func (a *app) deadListCommand() *cobra.Command {
	var (
		sel     deadSelector
		format  string
		limit   int
		after   int64
		summary bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead-lettered events with their last error",
		Long: `list shows dead-lettered events in Seq order, one page at a time: at most
--limit of them, after --after. The table shortens long errors; --format json
gives everything, payload included. --summary counts the dead events by type
and error instead, over all of them, to see at a glance what went wrong.`,
		Example: `  txoutbox dead list
  txoutbox dead list --type order.paid --limit 20
  txoutbox dead list --after 1200         # the next page, after Seq 1200
  txoutbox dead list --format json | jq -r '.[].id'
  txoutbox dead list --summary`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "table" && format != "json" {
				return usagef("--format %q: want table or json", format)
			}
			if limit < 1 {
				return usagef("--limit must be at least 1")
			}
			f, err := sel.filter(time.Now())
			if err != nil {
				return err
			}
			db, ob, err := a.openOutbox(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			if summary {
				return a.deadSummary(cmd, ob, f, format)
			}
			evs, err := ob.ListDead(cmd.Context(), f, sqlxoutbox.Page{AfterSeq: after, Limit: limit})
			if err != nil {
				return fmt.Errorf("list dead events: %w", err)
			}
			if len(evs) == limit {
				// On stderr, so that the JSON or table stays clean for pipes.
				defer fmt.Fprintf(a.stderr, "more may follow: txoutbox dead list --after %d\n", evs[len(evs)-1].Seq)
			}
			if format == "json" {
				s, err := a.sealer(cmd.Context())
				if err != nil {
					return err
				}
				out := make([]deadJSON, len(evs))
				for i, ev := range evs {
					ev, kid := showable(cmd.Context(), s, ev)
					out[i] = deadJSON{Seq: ev.Seq, ID: ev.ID, EventType: ev.EventType, AggregateType: ev.AggregateType,
						AggregateID: ev.AggregateID, CreatedAt: ev.CreatedAt.UTC(), DeadAt: ev.DeadAt, Attempts: ev.AttemptCount,
						LastError: ev.LastError, Headers: ev.Headers, Payload: ev.Payload, EncryptedWith: kid}
				}
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			writeDeadTable(a.stdout, evs)
			return nil
		},
	}
	sel.flags(cmd.Flags(), false)
	cmd.Flags().StringVar(&format, "format", "table", "output format: table or json")
	cmd.Flags().IntVar(&limit, "limit", 100, "most events to list")
	cmd.Flags().Int64Var(&after, "after", 0, "list events with a Seq greater than this (paging)")
	cmd.Flags().BoolVar(&summary, "summary", false, "count dead events by type and last error instead of listing them")
	return cmd
}

// deadGroup is one line of dead list --summary.
type deadGroup struct {
	EventType string `json:"event_type"`
	LastError string `json:"last_error"`
	Count     int    `json:"count"`
	FirstSeq  int64  `json:"first_seq"`
}

// uuidRE matches event IDs, which errors often name; the summary groups
// errors that differ only by them.
var uuidRE = regexp.MustCompile(`[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`)

// deadSummary groups every dead event f selects (up to countLimit) by type
// and last error, most frequent first.
func (a *app) deadSummary(cmd *cobra.Command, ob *sqlxoutbox.Outbox, f dialect.DeadFilter, format string) error {
	type key struct{ typ, err string }
	groups := map[key]*deadGroup{}
	page := sqlxoutbox.Page{Limit: 1000}
	seen := 0
	for seen < countLimit {
		evs, err := ob.ListDead(cmd.Context(), f, page)
		if err != nil {
			return fmt.Errorf("list dead events: %w", err)
		}
		for _, ev := range evs {
			k := key{ev.EventType, shorten(uuidRE.ReplaceAllString(ev.LastError, "<id>"), 100)}
			g := groups[k]
			if g == nil {
				g = &deadGroup{EventType: k.typ, LastError: k.err, FirstSeq: ev.Seq}
				groups[k] = g
			}
			g.Count++
		}
		seen += len(evs)
		if len(evs) < page.Limit {
			break
		}
		page.AfterSeq = evs[len(evs)-1].Seq
	}
	out := make([]deadGroup, 0, len(groups))
	for _, g := range groups {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(x, y deadGroup) int {
		if x.Count != y.Count {
			return y.Count - x.Count
		}
		return cmp.Compare(x.FirstSeq, y.FirstSeq)
	})
	if format == "json" {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	if len(out) == 0 {
		fmt.Fprintln(a.stdout, "no dead-lettered events")
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "COUNT\tTYPE\tFIRST SEQ\tLAST ERROR")
	for _, g := range out {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\n", g.Count, g.EventType, g.FirstSeq, g.LastError)
	}
	return tw.Flush()
}

func writeDeadTable(w io.Writer, evs []core.Event) {
	if len(evs) == 0 {
		fmt.Fprintln(w, "no dead-lettered events")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tID\tTYPE\tAGGREGATE\tATTEMPTS\tDEAD AT\tLAST ERROR")
	for _, ev := range evs {
		dead := "-"
		if ev.DeadAt != nil {
			dead = ev.DeadAt.UTC().Format(time.RFC3339)
		}
		agg := ev.AggregateType
		if ev.AggregateID != "" {
			agg += "/" + ev.AggregateID
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", ev.Seq, ev.ID, ev.EventType, orDefault(agg, "-"),
			ev.AttemptCount, dead, shorten(ev.LastError, 80))
	}
	tw.Flush()
}

// shorten keeps a table row on one line.
func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func (a *app) deadRetryCommand() *cobra.Command {
	var sel deadSelector
	cmd := &cobra.Command{
		Use:   "retry",
		Short: "Re-queue dead-lettered events with a fresh budget of attempts",
		Long: `retry makes the selected dead events pending again, due now, with their
attempt count reset; a running relay publishes them within its poll interval.
Their last error is kept for the record. Give at least one selector, or --all.`,
		Example: `  txoutbox dead retry --type order.paid
  txoutbox dead retry --id 0190c6d8-5a4e-7b1c-9f3e-2d8a1b6c4e5f --id 0190c6d8-5a4e-7b1c-9f3e-2d8a1b6c4e60
  txoutbox dead retry --seq 1201,1202
  txoutbox dead retry --all`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := sel.requireSelector("dead retry"); err != nil {
				return err
			}
			f, err := sel.filter(time.Now())
			if err != nil {
				return err
			}
			db, ob, err := a.openOutbox(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			n, err := ob.RetryDead(cmd.Context(), f)
			if err != nil {
				return fmt.Errorf("retry dead events: %w", err)
			}
			a.log.Info("txoutbox: dead events re-queued", "selection", sel.describe(), "count", n)
			fmt.Fprintf(a.stdout, "re-queued %d dead event(s)\n", n)
			return nil
		},
	}
	sel.flags(cmd.Flags(), true)
	return cmd
}

func (a *app) deadPurgeCommand() *cobra.Command {
	var (
		sel deadSelector
		yes bool
	)
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete dead-lettered events for good (asks first)",
		Long: `purge deletes the selected dead events. They are gone: they will never be
published, and cannot be replayed. It shows how many events match and asks for
confirmation; --yes skips the question (scripts). Give at least one selector,
or --all.`,
		Example: `  txoutbox dead purge --id 0190c6d8-5a4e-7b1c-9f3e-2d8a1b6c4e5f
  txoutbox dead purge --type legacy.event --yes
  txoutbox dead purge --dead-before 720h --yes   # dead for more than 30 days`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := sel.requireSelector("dead purge"); err != nil {
				return err
			}
			f, err := sel.filter(time.Now())
			if err != nil {
				return err
			}
			db, ob, err := a.openOutbox(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			if !yes {
				n, more, err := countDead(cmd, ob, f)
				if err != nil {
					return err
				}
				if n == 0 {
					fmt.Fprintln(a.stdout, "no dead-lettered events match; nothing to purge")
					return nil
				}
				count := fmt.Sprint(n)
				if more {
					count = "at least " + count
				}
				if !a.confirm(fmt.Sprintf("Permanently delete %s dead-lettered event(s) (%s)? [y/N] ", count, sel.describe())) {
					return ErrAborted
				}
			}
			n, err := ob.PurgeDead(cmd.Context(), f)
			if err != nil {
				return fmt.Errorf("purge dead events: %w", err)
			}
			a.log.Info("txoutbox: dead events purged", "selection", sel.describe(), "count", n)
			fmt.Fprintf(a.stdout, "purged %d dead event(s)\n", n)
			return nil
		},
	}
	sel.flags(cmd.Flags(), true)
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

// countLimit bounds how many dead events the purge confirmation counts.
const countLimit = 100_000

// countDead counts the dead events f selects, page by page, up to countLimit.
func countDead(cmd *cobra.Command, ob *sqlxoutbox.Outbox, f dialect.DeadFilter) (n int, more bool, err error) {
	page := sqlxoutbox.Page{Limit: 1000}
	for n < countLimit {
		evs, err := ob.ListDead(cmd.Context(), f, page)
		if err != nil {
			return n, false, fmt.Errorf("count dead events: %w", err)
		}
		n += len(evs)
		if len(evs) < page.Limit {
			return n, false, nil
		}
		page.AfterSeq = evs[len(evs)-1].Seq
	}
	return n, true, nil
}

// confirm asks question on stderr and reads the answer from stdin; only y
// or yes confirms. No answer (end of input, no terminal) is a no.
func (a *app) confirm(question string) bool {
	fmt.Fprint(a.stderr, question)
	line, err := bufio.NewReader(a.stdin).ReadString('\n')
	if err != nil && line == "" {
		fmt.Fprintln(a.stderr)
		return false
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}
