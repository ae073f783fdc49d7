package console

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/ordered"
)

// liveOwners counts the live leases of each relay.
func liveOwners(ls []ordered.Lease) map[string]int {
	owners := map[string]int{}
	for _, l := range ls {
		if l.Live && l.Owner != "" {
			owners[l.Owner]++
		}
	}
	return owners
}

type relayRow struct {
	Owner      string
	Partitions int
}

type orderedData struct {
	Held       []dialect.HeldAggregate
	HasLeases  bool
	Partitions int
	Free       int
	Relays     []relayRow
	Leases     []ordered.Lease
}

// ordered shows what ordered mode holds back and why, and, with Leases,
// which relay holds which partition.
func (c *Console) orderedPage(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	held, err := c.store.HeldAggregates(r.Context(), 200)
	if err != nil {
		c.fail(w, err)
		return
	}
	d := orderedData{Held: held}
	if c.opts.Leases != nil {
		ls, err := c.opts.Leases.Leases(r.Context())
		if err != nil {
			c.fail(w, err)
			return
		}
		d.HasLeases, d.Partitions, d.Leases = true, c.opts.Leases.PartitionCount(), ls
		for owner, n := range liveOwners(ls) {
			d.Relays = append(d.Relays, relayRow{owner, n})
		}
		slices.SortFunc(d.Relays, func(a, b relayRow) int { return strings.Compare(a.Owner, b.Owner) })
		for _, l := range ls {
			if !l.Live {
				d.Free++
			}
		}
	}
	c.render(w, r, "ordered.html", "ordered", start, d)
}
