package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.yaml.in/yaml/v3"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/binlogrelay"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/mysqldsn"
	"github.com/txoutbox/txoutbox/metrics"
	"github.com/txoutbox/txoutbox/relaygroup"
)

// groupFile is the file of relay --config: the outboxes one process relays.
type groupFile struct {
	Outboxes []outboxSpec `yaml:"outboxes"`
}

// outboxSpec is one outbox of a --config file. Unset fields take the
// relay command's flags.
type outboxSpec struct {
	Name         string  `yaml:"name" json:"name"`
	DSN          string  `yaml:"dsn" json:"dsn,omitempty"`
	DSNEnv       string  `yaml:"dsn_env" json:"dsn_env,omitempty"`
	Table        string  `yaml:"table" json:"table,omitempty"`
	Broker       string  `yaml:"broker" json:"broker,omitempty"`
	BrokerEnv    string  `yaml:"broker_env" json:"broker_env,omitempty"`
	Mode         string  `yaml:"mode" json:"mode,omitempty"`
	BatchSize    *int    `yaml:"batch_size" json:"batch_size,omitempty"`
	Concurrency  *int    `yaml:"concurrency" json:"concurrency,omitempty"`
	PollInterval *string `yaml:"poll_interval" json:"poll_interval,omitempty"`
	Ordering     *string `yaml:"ordering" json:"ordering,omitempty"`
	MaxAttempts  *int    `yaml:"max_attempts" json:"max_attempts,omitempty"`
	// DeleteOnPublish is relay --delete-on-publish for this outbox.
	DeleteOnPublish *bool `yaml:"delete_on_publish" json:"delete_on_publish,omitempty"`
	// Log mode: PostgreSQL's slot and publication, MySQL's stream.
	Slot        string `yaml:"slot" json:"slot,omitempty"`
	Publication string `yaml:"publication" json:"publication,omitempty"`
	Stream      string `yaml:"stream" json:"stream,omitempty"`

	// Resolved by loadGroupFile.
	dsn, broker string
	flags       relayFlags
}

// loadGroupFile reads and checks a --config file: every error names the
// outbox and the field, and nothing connects before the whole file is
// valid.
func loadGroupFile(path string, defaults relayFlags) ([]outboxSpec, error) {
	specs, err := readGroupFile(path, func(s *outboxSpec, seen map[string]bool) error { return s.resolve(defaults, seen) })
	if err != nil {
		return nil, err
	}
	// Two log-mode outboxes read by one slot (or stream) of one database
	// would take turns: one streams, the other stands by for good.
	readers := map[string]string{}
	for _, s := range specs {
		if s.Mode != "log" {
			continue
		}
		key := s.dsn + "\x00" + s.Slot + "\x00" + s.Stream
		if other, ok := readers[key]; ok {
			return nil, usagef("--config %s: outboxes %q and %q are in log mode on one database with one slot (or stream): give each its own slot: (PostgreSQL) or stream: (MySQL)", path, other, s.Name)
		}
		readers[key] = s.Name
	}
	return specs, nil
}

// readGroupFile reads a --config file and checks each outbox with check.
func readGroupFile(path string, check func(s *outboxSpec, seen map[string]bool) error) ([]outboxSpec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("--config: %v", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var gf groupFile
	if err := dec.Decode(&gf); err != nil {
		return nil, usagef("--config %s: %v", path, err)
	}
	if len(gf.Outboxes) == 0 {
		return nil, usagef("--config %s lists no outboxes (want a list under \"outboxes:\")", path)
	}
	seen := map[string]bool{}
	for i := range gf.Outboxes {
		s := &gf.Outboxes[i]
		where := fmt.Sprintf("--config %s: outbox %d", path, i+1)
		if s.Name != "" {
			where = fmt.Sprintf("--config %s: outbox %q", path, s.Name)
		}
		if err := check(s, seen); err != nil {
			return nil, usagef("%s: %v", where, err)
		}
	}
	return gf.Outboxes, nil
}

// resolveTable checks and resolves what names an outbox and where its
// table is: what stats --config needs of the file.
func (s *outboxSpec) resolveTable(seen map[string]bool) error {
	switch {
	case s.Name == "":
		return fmt.Errorf("no name")
	case seen[s.Name]:
		return fmt.Errorf("the name is used twice")
	}
	seen[s.Name] = true
	var err error
	if s.dsn, err = fromEnv("dsn", s.DSN, s.DSNEnv); err != nil {
		return err
	}
	if _, _, _, err := parseDSN(s.dsn); err != nil {
		return err
	}
	if s.Table == "" {
		s.Table = dialect.DefaultTable
	}
	if _, err := dialect.ValidateIdentifier(s.Table); err != nil {
		return fmt.Errorf("table: %w", err)
	}
	return nil
}

// resolve checks and resolves everything the relay needs of an outbox.
func (s *outboxSpec) resolve(defaults relayFlags, seen map[string]bool) error {
	if err := s.resolveTable(seen); err != nil {
		return err
	}
	var err error
	if s.broker, err = fromEnv("broker", s.Broker, s.BrokerEnv); err != nil {
		return err
	}
	if err := checkBrokerURL(s.broker); err != nil {
		return err
	}
	switch s.Mode {
	case "", "table":
		s.Mode = "table"
		if s.Slot != "" || s.Publication != "" || s.Stream != "" {
			return fmt.Errorf("slot, publication and stream are log mode's: add mode: log")
		}
	case "log":
		if _, _, d, _ := parseDSN(s.dsn); d != dialect.Postgres && d != dialect.MySQL {
			return fmt.Errorf("mode log needs PostgreSQL (logical replication) or MySQL/MariaDB (the binlog); %s has neither", d.Name())
		}
		s.Slot = cmp.Or(s.Slot, defaults.slot)
		s.Publication = cmp.Or(s.Publication, defaults.publication)
		s.Stream = cmp.Or(s.Stream, defaults.stream)
	default:
		return fmt.Errorf("mode %q: want table or log", s.Mode)
	}
	f := defaults
	if s.BatchSize != nil {
		f.batchSize = *s.BatchSize
	}
	if s.Concurrency != nil {
		f.concurrency = *s.Concurrency
	}
	if s.MaxAttempts != nil {
		f.maxAttempts = *s.MaxAttempts
	}
	if s.Ordering != nil {
		f.ordering = *s.Ordering
	}
	if s.DeleteOnPublish != nil {
		f.deleteOnPublish = *s.DeleteOnPublish
	}
	if s.PollInterval != nil {
		if f.pollInterval, err = time.ParseDuration(*s.PollInterval); err != nil {
			return fmt.Errorf("poll_interval: %v", err)
		}
	}
	if _, ok := orderingModes[f.ordering]; !ok {
		return fmt.Errorf("ordering %q: want auto, on or off", f.ordering)
	}
	if err := checkRelayFlags(f); err != nil {
		return err
	}
	s.flags = f
	return nil
}

// fromEnv is a field given as a value or as the name of an environment
// variable that holds it (for secrets), exactly one of them.
func fromEnv(field, value, env string) (string, error) {
	switch {
	case value != "" && env != "":
		return "", fmt.Errorf("both %s and %s_env: give one", field, field)
	case env != "":
		v := os.Getenv(env)
		if v == "" {
			return "", fmt.Errorf("%s_env: the environment variable %s is not set", field, env)
		}
		return v, nil
	case value == "":
		return "", fmt.Errorf("no %s (or %s_env)", field, field)
	}
	return value, nil
}

var orderingModes = map[string]core.OrderingMode{"auto": core.OrderingAuto, "on": core.OrderingOn, "off": core.OrderingOff}

// spec is what restarts a member when it changes on reload (the resolved
// DSN and broker included, so that a new secret in the environment
// counts).
func (s *outboxSpec) spec() string {
	b, _ := json.Marshal(struct {
		S           *outboxSpec
		DSN, Broker string
	}{s, s.dsn, s.broker})
	return string(b)
}

// pools shares one *sql.DB between the outboxes of one DSN (tables or
// schemas of one database), so that connections grow with databases, not
// with outboxes.
type pools struct {
	mu  sync.Mutex
	dbs map[string]*database
	// perDB, when set, caps each pool's connections (--max-connections).
	perDB int
}

// limit caps every pool, those open and those to come, at perDB
// connections.
func (p *pools) limit(perDB int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.perDB = perDB
	for _, db := range p.dbs {
		p.size(db)
	}
}

func (p *pools) size(db *database) {
	if p.perDB > 0 && db.dialect.MaxConcurrency() != 1 {
		db.db.SetMaxOpenConns(p.perDB)
		db.db.SetMaxIdleConns(p.perDB)
	}
}

// memberStates tells what each running member of a relay group does, for
// /healthz.
type memberStates struct {
	mu sync.Mutex
	m  map[string]func() string
}

func (s *memberStates) set(name string, state func() string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[name] = state
}

func (s *memberStates) get(name string) string {
	s.mu.Lock()
	f := s.m[name]
	s.mu.Unlock()
	if f == nil {
		return "starting"
	}
	return f()
}

func (p *pools) get(dsn string) (*database, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if db, ok := p.dbs[dsn]; ok {
		return db, nil
	}
	db, err := openDatabaseLazily(dsn)
	if err != nil {
		return nil, err
	}
	p.size(db)
	p.dbs[dsn] = db
	return db, nil
}

func (p *pools) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, db := range p.dbs {
		db.Close()
	}
}

// runGroup is relay --config: one process relays every outbox of the file
// (a relaygroup.Group), and SIGHUP reloads the file.
func (a *app) runGroup(ctx context.Context, f relayFlags) error {
	specs, err := loadGroupFile(f.config, f)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	group, err := relaygroup.New(relaygroup.Options{Logger: a.log})
	if err != nil {
		return err
	}
	reg.MustRegister(groupCollector{group})
	ps := &pools{dbs: map[string]*database{}}
	states := &memberStates{m: map[string]func() string{}}
	defer ps.close()
	var h health
	h.set("ok")
	h.outboxes = func() []outboxHealth {
		st := group.Status()
		out := make([]outboxHealth, len(st))
		for i, m := range st {
			out[i] = outboxHealth{Name: m.Name, State: "restarting", Restarts: m.Restarts}
			if m.Running {
				out[i].State = states.get(m.Name)
			}
		}
		return out
	}
	context.AfterFunc(ctx, func() { h.set("stopping") })
	if f.httpAddr != "" {
		// Readiness is the process's: one tenant's database down must not
		// take every other outbox's relay out of service.
		srv, addr, err := a.serveHTTP(f.httpAddr, reg, nil, &h)
		if err != nil {
			return err
		}
		a.log.Info("txoutbox: serving /metrics and /healthz", "addr", addr)
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	apply := func(specs []outboxSpec) error {
		if f.maxConnections > 0 {
			// Shared evenly by the databases of the file; a relay needs
			// two at least (its claim, and its stats or leases).
			dsns := map[string]bool{}
			for _, s := range specs {
				dsns[s.dsn] = true
			}
			per := f.maxConnections / len(dsns)
			if per < 2 {
				per = 2
				a.log.Warn("txoutbox: relay group: --max-connections leaves fewer than 2 connections per database; each database keeps 2",
					"max_connections", f.maxConnections, "databases", len(dsns))
			}
			ps.limit(per)
			a.log.Info("txoutbox: relay group: connections capped", "max_connections", f.maxConnections, "databases", len(dsns), "per_database", per)
		}
		members := make([]relaygroup.Member, len(specs))
		for i := range specs {
			s := specs[i]
			members[i] = relaygroup.Member{Name: s.Name, Spec: s.spec(), Run: func(ctx context.Context) error { return a.runMember(ctx, s, ps, states, reg, f) }}
		}
		return group.Set(members)
	}
	if err := apply(specs); err != nil {
		return err
	}
	a.log.Info("txoutbox: relay group started", "config", f.config, "outboxes", len(specs))
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	done := make(chan error, 1)
	go func() { done <- group.Run(ctx) }()
	for {
		select {
		case err := <-done:
			a.log.Info("txoutbox: relay group stopped")
			return err
		case <-hup:
			specs, err := loadGroupFile(f.config, f)
			if err == nil {
				err = apply(specs)
			}
			if err != nil {
				a.log.Error("txoutbox: relay group: reload refused; the outboxes run as before", "config", f.config, "error", err)
				continue
			}
			a.log.Info("txoutbox: relay group reloaded", "config", f.config, "outboxes", len(specs))
		}
	}
}

// runMember relays one outbox of the group until ctx ends: its store on the
// DSN's shared pool, its broker, its metrics labelled outbox="name", its
// stats monitor.
func (a *app) runMember(ctx context.Context, s outboxSpec, ps *pools, states *memberStates, reg *prometheus.Registry, defaults relayFlags) error {
	log := a.log.With("outbox", s.Name)
	f := s.flags
	db, err := ps.get(s.dsn)
	if err != nil {
		return err
	}
	ob, err := sqlxoutbox.NewDB(db.db, sqlxoutbox.Options{Dialect: db.dialect, Table: s.Table, Logger: log, SyncMark: defaults.syncMark, DeleteOnPublish: s.flags.deleteOnPublish})
	if err != nil {
		return err
	}
	ma := &app{log: log, stdout: a.stdout, stderr: a.stderr}
	state := func(st string) func() string { return func() string { return st } }
	states.set(s.Name, state("waiting for its database"))
	if err := ma.awaitDependency(ctx, "database", db.redacted, false, ob.Ping); err != nil || ctx.Err() != nil {
		return err
	}
	var pub publisher
	states.set(s.Name, state("waiting for its broker"))
	if err := ma.awaitDependency(ctx, "broker", redact(s.broker), false, func(ctx context.Context) error {
		p, err := openBroker(ctx, s.broker, a.stdout, log, logTxID(s.Mode, db.dialect, s.Slot, s.Stream))
		pub = p
		return err
	}); err != nil || ctx.Err() != nil {
		return err
	}
	defer func() {
		if err := pub.Close(); err != nil {
			log.Warn("txoutbox: close broker", "error", err)
		}
	}()
	met, err := metrics.New(metrics.Options{Registerer: reg, LagThreshold: f.lagThreshold, ConstLabels: prometheus.Labels{"outbox": s.Name}})
	if err != nil {
		return err
	}
	defer reg.Unregister(met)
	ropts := core.RelayOptions{
		BatchSize: f.batchSize, PollInterval: f.pollInterval, Concurrency: f.concurrency,
		ShutdownTimeout: f.shutdownTimeout, PublishTimeout: publishTimeout(f.publishTimeout),
		Retry:    core.RetryPolicy{MaxAttempts: f.maxAttempts, InitialBackoff: f.initialBackoff, MaxBackoff: f.maxBackoff},
		Logger:   log,
		Ordering: orderingModes[f.ordering],
		Ordered:  core.OrderedOptions{PartitionCount: f.partitions},
	}
	var (
		relay  *core.Relay
		runner relayRunner
		stats  core.StatsReader = ob
	)
	if s.Mode == "log" {
		// Its stream's metrics carry the outbox label too, and go when it
		// stops, as its others do.
		lreg := &memberRegisterer{reg: prometheus.WrapRegistererWith(prometheus.Labels{"outbox": s.Name}, reg)}
		defer lreg.unregisterAll()
		lr, err := newLogRelay(s.dsn, db.dialect, logrelayNames{table: s.Table, slot: s.Slot, publication: s.Publication, stream: s.Stream},
			met.Store(ob), met.Publisher(pub), ropts, lreg, log)
		if err != nil {
			return err
		}
		relay, runner, stats = lr.table, lr.runner, lr.stats
		defer func(start time.Time) { lr.stopped(time.Since(start).Round(time.Millisecond)) }(time.Now())
	} else {
		if relay, err = core.NewRelay(met.Store(ob), met.Publisher(pub), ropts); err != nil {
			return err
		}
		runner = relay
	}
	mon, err := core.NewMonitor(stats, met.MonitorOptions(core.MonitorOptions{Interval: f.statsInterval, Logger: log}))
	if err != nil {
		return err
	}
	mctx, stopMon := context.WithCancel(ctx)
	var bg sync.WaitGroup
	defer func() { stopMon(); bg.Wait() }()
	bg.Go(func() { _ = mon.Run(mctx) })
	if s.Mode == "table" && defaults.wake == "auto" && db.dialect == dialect.MySQL {
		// As relay --wake auto: producers' commits reach the binlog, which
		// wakes this outbox's relay (polling stays if it cannot be read).
		driverDSN, err := mysqldsn.DriverDSN(s.dsn)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUsage, err)
		}
		w, err := binlogrelay.NewWatcher(driverDSN, relay, binlogrelay.WatcherOptions{Table: s.Table, Logger: log})
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUsage, err)
		}
		bg.Go(func() { _ = w.Run(mctx) })
	}
	log.Info("txoutbox: relay started", "database", db.redacted, "table", s.Table, "broker", redact(s.broker), "mode", s.Mode,
		"batch_size", f.batchSize, "concurrency", f.concurrency, "ordered", relay.Ordered())
	states.set(s.Name, func() string {
		switch h := runner.Health(); {
		case h.StoreDown:
			return "database down"
		case h.BrokerDown:
			return "broker down"
		}
		return "ok"
	})
	return runner.Run(ctx)
}

// memberRegisterer registers a group member's collectors and unregisters
// them all when the member stops, so that a restarted or removed member
// leaves none behind.
type memberRegisterer struct {
	reg prometheus.Registerer
	mu  sync.Mutex
	cs  []prometheus.Collector
}

func (m *memberRegisterer) Register(c prometheus.Collector) error {
	if err := m.reg.Register(c); err != nil {
		return err
	}
	m.mu.Lock()
	m.cs = append(m.cs, c)
	m.mu.Unlock()
	return nil
}

func (m *memberRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := m.Register(c); err != nil {
			panic(err)
		}
	}
}

func (m *memberRegisterer) Unregister(c prometheus.Collector) bool { return m.reg.Unregister(c) }

func (m *memberRegisterer) unregisterAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.cs {
		m.reg.Unregister(c)
	}
	m.cs = nil
}

// groupCollector exports the group's members: running or waiting to
// restart, and their restarts.
type groupCollector struct{ g *relaygroup.Group }

var (
	memberUpDesc = prometheus.NewDesc("txoutbox_group_member_running",
		"1 while the outbox's relay runs, 0 while it waits to be started again after an error.", []string{"outbox"}, nil)
	memberRestartsDesc = prometheus.NewDesc("txoutbox_group_member_restarts_total",
		"Times the outbox's relay stopped with an error and was started again.", []string{"outbox"}, nil)
)

func (c groupCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- memberUpDesc
	ch <- memberRestartsDesc
}

func (c groupCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.g.Status() {
		up := 0.0
		if s.Running {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(memberUpDesc, prometheus.GaugeValue, up, s.Name)
		ch <- prometheus.MustNewConstMetric(memberRestartsDesc, prometheus.CounterValue, float64(s.Restarts), s.Name)
	}
}
