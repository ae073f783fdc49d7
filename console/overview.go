package console

import (
	"context"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// sample is one point of the overview's charts.
type sample struct {
	At        time.Time
	Pending   int64
	OldestAge time.Duration
	Dead      int64
	// Published is the events published since the previous sample.
	Published int64
	// Rate is Published per second since the previous sample.
	Rate float64
}

// maxSamples bounds the charts: an hour at the default interval.
const maxSamples = 720

// sample reads the stats and the events published since the previous
// sample, and keeps the point.
func (c *Console) sample(ctx context.Context) (core.Stats, error) {
	s, err := c.store.Stats(ctx)
	if err != nil {
		return s, err
	}
	now := time.Now()
	c.mu.Lock()
	var prev time.Time
	if n := len(c.samples); n > 0 {
		prev = c.samples[n-1].At
	}
	c.mu.Unlock()
	pt := sample{At: now, Pending: s.Pending, OldestAge: s.OldestPendingAge, Dead: s.Dead}
	if !prev.IsZero() {
		n, err := c.store.CountPublishedSince(ctx, prev)
		if err != nil {
			return s, err
		}
		pt.Published = n
		if el := now.Sub(prev).Seconds(); el > 0 {
			pt.Rate = float64(n) / el
		}
	}
	c.mu.Lock()
	c.samples = append(c.samples, pt)
	if len(c.samples) > maxSamples {
		c.samples = slices.Delete(c.samples, 0, len(c.samples)-maxSamples)
	}
	c.mu.Unlock()
	return s, nil
}

type typeRow struct {
	Type             string
	Pending, Dead    int64
	Scheduled        int64
	OldestPendingAge time.Duration
}

type overviewData struct {
	Stats             core.Stats
	Types             []typeRow
	Rows              int64
	RowsEstimated     bool
	Lagging           bool
	LagThreshold      time.Duration
	Samples           int
	PendingChart      template.HTML
	AgeChart          template.HTML
	RateChart         template.HTML
	LastRate          float64
	SampleInterval    time.Duration
	DeadGroups        int
	PublishedEstimate int64
	// Relays is the relays holding live partition leases (ordered mode),
	// -1 when the console was given no Leases.
	Relays int
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	s, err := c.sample(r.Context())
	if err != nil {
		c.fail(w, err)
		return
	}
	rows, est, err := c.store.EstimateRows(r.Context())
	if err != nil {
		c.fail(w, err)
		return
	}
	d := overviewData{Stats: s, Rows: rows, RowsEstimated: est, LagThreshold: c.opts.LagThreshold,
		Lagging: s.Pending > 0 && s.OldestPendingAge > c.opts.LagThreshold, SampleInterval: c.opts.SampleInterval}
	d.PublishedEstimate = max(rows-s.Pending-s.Dead-s.Scheduled, 0)
	d.Relays = -1
	if c.opts.Leases != nil {
		ls, err := c.opts.Leases.Leases(r.Context())
		if err != nil {
			c.fail(w, err)
			return
		}
		d.Relays = len(liveOwners(ls))
	}
	for name, ts := range s.ByType {
		d.Types = append(d.Types, typeRow{Type: name, Pending: ts.Pending, Dead: ts.Dead, Scheduled: ts.Scheduled, OldestPendingAge: ts.OldestPendingAge})
	}
	slices.SortFunc(d.Types, func(a, b typeRow) int { return strings.Compare(a.Type, b.Type) })
	c.mu.Lock()
	pts := slices.Clone(c.samples)
	c.mu.Unlock()
	d.Samples = len(pts)
	pending := make([]float64, len(pts))
	ages := make([]float64, len(pts))
	rate := make([]float64, 0, len(pts))
	for i, p := range pts {
		pending[i] = float64(p.Pending)
		ages[i] = p.OldestAge.Seconds()
		if i > 0 {
			rate = append(rate, p.Rate)
		}
	}
	if len(rate) > 0 {
		d.LastRate = rate[len(rate)-1]
	}
	d.PendingChart = sparkline(pending, "pending events")
	d.RateChart = sparkline(rate, "events published per second")
	d.AgeChart = sparkline(ages, "oldest pending age, seconds")
	c.render(w, r, "overview.html", "overview", start, d)
}
