package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/txoutbox/txoutbox/binlogrelay"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/logmode"
	"github.com/txoutbox/txoutbox/logrelay"
	"github.com/txoutbox/txoutbox/ordered"
)

// health is what /healthz answers: the relay's state.
type health struct {
	state atomic.Value // string: starting, ok, stopping
	// outboxes, in a relay group, says how each outbox's relay runs.
	outboxes func() []outboxHealth
}

// outboxHealth is one outbox of a relay group in /healthz: what its relay
// does (ok, starting, waiting for its database or broker, database down,
// broker down, restarting after an error), and how often it was
// restarted. Its errors go to the log.
type outboxHealth struct {
	Name     string `json:"name"`
	State    string `json:"state"`
	Restarts int    `json:"restarts"`
}

func (h *health) set(s string) { h.state.Store(s) }

func (h *health) get() string { s, _ := h.state.Load().(string); return s }

// registerHealthMetrics exports the relay's view of its dependencies, the
// states its "down" and "back" log lines announce.
func registerHealthMetrics(reg prometheus.Registerer, r interface{ Health() core.RelayHealth }) {
	up := func(down bool) float64 {
		if down {
			return 0
		}
		return 1
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "txoutbox", Name: "broker_up",
			Help: "0 while the broker takes no event of the relay's batches, 1 otherwise."},
			func() float64 { return up(r.Health().BrokerDown) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "txoutbox", Name: "store_up",
			Help: "0 while the relay's batches fail at the database, 1 otherwise."},
			func() float64 { return up(r.Health().StoreDown) }),
	)
}

func logGauge(name, help string, f func() float64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "txoutbox", Subsystem: "log", Name: name, Help: help}, f)
}

func boolGauge(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// streamMetrics are the metrics both log modes have, with one help text
// each: a relay group may run outboxes of both in one registry.
func streamMetrics(streaming func() bool, counters func() logmode.Counters) []prometheus.Collector {
	counter := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "txoutbox", Subsystem: "log", Name: name, Help: help}, f)
	}
	return []prometheus.Collector{
		logGauge("streaming", "1 while this relay streams the slot (or binlog), 0 while it stands by or reconnects.", func() float64 { return boolGauge(streaming()) }),
		counter("published_total", "Events published from the stream.", func() float64 { return float64(counters().Published) }),
		counter("table_writes_total", "Events the stream handed to the table's retry path (failed, or held behind a failed one).",
			func() float64 { return float64(counters().TableWrites) }),
		counter("stream_starts_total", "Times this relay started streaming (start, reconnections, takeovers).",
			func() float64 { return float64(counters().Streams) }),
	}
}

// registerLogMetrics exports log mode's stream and slot: whether this
// process streams, what the slot retains, and the stream's totals.
func registerLogMetrics(reg prometheus.Registerer, r *logmode.Relay) {
	slot := func() logrelay.SlotStatus { st, _ := logrelay.LastSlotStatus(r); return st }
	reg.MustRegister(streamMetrics(r.Streaming, r.Counters)...)
	reg.MustRegister(
		logGauge("retained_wal_bytes", "WAL the slot keeps the server from removing (at the latest stats check).",
			func() float64 { return float64(slot().RetainedBytes) }),
		logGauge("unconfirmed_wal_bytes", "WAL written since the slot's confirmed position (at the latest stats check).",
			func() float64 { return float64(slot().UnconfirmedBytes) }),
		logGauge("slot_invalidated", "1 when the server invalidated the slot (wal_status lost): events may be missing.",
			func() float64 { return boolGauge(slot().Invalidated) }),
		logGauge("confirmed_lag_seconds", "How long ago the WAL at the slot's confirmed position was written, as the streaming walsender measures it; -1 when no relay streams (at the latest stats check).",
			func() float64 {
				st := slot()
				if st.ConfirmedAge < 0 {
					return -1
				}
				return st.ConfirmedAge.Seconds()
			}),
	)
}

// registerBinlogMetrics exports log mode's stream on MySQL and MariaDB:
// whether this process streams, how far the stored position is behind the
// server's binlog, whether its file was purged, and the stream's totals.
func registerBinlogMetrics(reg prometheus.Registerer, r *logmode.Relay) {
	status := func() binlogrelay.Status { st, _ := binlogrelay.LastStatus(r); return st }
	reg.MustRegister(streamMetrics(r.Streaming, r.Counters)...)
	reg.MustRegister(
		logGauge("behind_binlog_bytes", "Binlog written since the stream's stored position (at the latest stats check).",
			func() float64 { return float64(status().BehindBytes) }),
		logGauge("position_lag_seconds", "How long the stream has stored no position while the binlog has more than its own writes after it (at the latest stats check).",
			func() float64 { return status().Lag.Seconds() }),
		logGauge("binlog_purged", "1 when the server purged the binlog file of the stream's position: run txoutbox log recover.",
			func() float64 {
				return boolGauge(binlogrelay.BinlogPurged(r) || (status().Exists && !status().FilesHeld))
			}),
	)
}

// registerLeaserMetrics exposes the partition leases of ordered mode: how
// many partitions this relay holds (summed over relays it should equal the
// partition count) and how often leases changed hands.
func registerLeaserMetrics(reg prometheus.Registerer, l *ordered.Leaser) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "txoutbox", Name: "partitions_held",
			Help: "Ordered-mode partitions this relay holds a lease on."},
			func() float64 { return float64(len(l.Held())) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "txoutbox", Name: "partitions",
			Help: "Ordered-mode partitions of the outbox."},
			func() float64 { return float64(l.PartitionCount()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "txoutbox", Name: "partition_takeovers_total",
			Help: "Expired leases of other relays this relay took over (failovers)."},
			func() float64 { return float64(l.Stats().Takeovers) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "txoutbox", Name: "partition_leases_lost_total",
			Help: "Leases this relay found taken by another relay (it stalled past the lease)."},
			func() float64 { return float64(l.Stats().Lost) }),
	)
}

// healthReport is the body of /healthz: the status only, so that a probe
// open to the network learns nothing of the database; the reasons go to
// the log.
type healthReport struct {
	Status string `json:"status"` // ok, starting, unavailable, stopping
	// Outboxes: relay --config's, each by name. The process stays ready
	// while one of them is down: it serves the others.
	Outboxes []outboxHealth `json:"outboxes,omitempty"`
}

// serveHTTP listens on addr (first, so that a taken port fails the start)
// and serves /metrics and /healthz. It returns the server and the address
// it listens on, which tells the port of ":0".
func (a *app) serveHTTP(addr string, reg *prometheus.Registry, db *database, h *health) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		hint := ""
		if errors.Is(err, syscall.EADDRINUSE) {
			hint = ` (another relay on this host? give each its own --http-addr, or --http-addr "" to serve no metrics)`
		}
		return nil, "", fmt.Errorf("listen on --http-addr %s: %w%s", addr, err, hint)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, ErrorLog: slogErrorLog{a}}))
	var dbDown atomic.Bool
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		status := h.get()
		if status == "ok" && db != nil {
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			err := db.db.PingContext(ctx)
			cancel()
			switch {
			case err != nil:
				status = "unavailable"
				if !dbDown.Swap(true) {
					a.log.Warn("txoutbox: /healthz: the database does not answer", "error", err)
				}
			case dbDown.Swap(false):
				a.log.Info("txoutbox: /healthz: the database answers again")
			}
		}
		code := http.StatusOK
		if status != "ok" {
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		rep := healthReport{Status: status}
		if h.outboxes != nil {
			rep.Outboxes = h.outboxes()
		}
		_ = json.NewEncoder(w).Encode(rep)
	})
	// /livez only says the process serves: a liveness probe on /healthz
	// would restart every relay while the database is down, which cures
	// nothing and loses the batch in flight.
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("txoutbox: http server stopped", "error", err)
		}
	}()
	return srv, ln.Addr().String(), nil
}

// slogErrorLog adapts the logger to promhttp's ErrorLog.
type slogErrorLog struct{ a *app }

func (l slogErrorLog) Println(v ...any) {
	l.a.log.Error("txoutbox: serving metrics", "error", fmt.Sprint(v...))
}
