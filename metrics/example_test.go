package metrics_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/metrics"
)

// Decorate the relay's store and publisher, and let the monitor set the
// gauges. Serve reg with promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).
func Example() {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(metrics.Options{Registerer: reg, LagThreshold: 2 * time.Minute})
	if err != nil {
		panic(err)
	}
	var store core.Store = newMemStore(events("order.created", 3, time.Second)...) // your adapter's Outbox
	pub := core.PublisherFunc(func(context.Context, []core.Event) error { return nil })

	relay, err := core.NewRelay(m.Store(store), m.Publisher(pub), core.RelayOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	if _, err := relay.Drain(context.Background()); err != nil {
		panic(err)
	}
	// With a real store: mon, _ := core.NewMonitor(outbox, m.MonitorOptions(core.MonitorOptions{}))
	// and go mon.Run(ctx).

	n, _ := testutil.GatherAndCount(reg, "txoutbox_events_published_total")
	fmt.Println("published series:", n)
	fmt.Println("threshold:", testutil.ToFloat64(gaugeOf(reg, "txoutbox_lag_threshold_seconds")))
	// Output:
	// published series: 1
	// threshold: 120
}

// gaugeOf copies the value of a single-series gauge out of a gatherer.
func gaugeOf(g prometheus.Gatherer, name string) prometheus.Gauge {
	out := prometheus.NewGauge(prometheus.GaugeOpts{Name: "copy"})
	mfs, _ := g.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			out.Set(mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	return out
}
