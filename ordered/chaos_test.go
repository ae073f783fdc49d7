package ordered_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/tier"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/logrelay"
	"github.com/txoutbox/txoutbox/ordered"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// Tuning of the chaos test. TXOUTBOX_SOAK=1 multiplies the load by ten.
const (
	chaosRelays     = 3
	chaosPartitions = 32
	chaosLeaseTTL   = 2 * time.Second
	chaosBatch      = 200
	chaosFailRate   = 0.10 // refused before sending
	chaosLieRate    = 0.01 // sent, then reported failed: a duplicate
)

// TestOutageChaosOrdered runs three ordered relays as OS processes against
// one PostgreSQL outbox and a real RabbitMQ, with a publisher refusing 10 %
// of events, while relays are SIGKILLed and restarted at random and the
// broker is restarted once. Every event must arrive, every aggregate's
// first deliveries must be in enqueue order, and a dead relay's partitions
// must be taken over within the lease TTL plus one renew interval (plus
// scheduling slack). It restarts the shared RabbitMQ, hence "Outage" in its
// name: make test runs it in the serial step.
func TestOutageChaosOrdered(t *testing.T) {
	tier.SkipShort(t)
	numEvents, numAggs := 50_000, 500
	budget := 5 * time.Minute
	if os.Getenv("TXOUTBOX_SOAK") != "" || tier.Long() {
		numEvents, numAggs, budget = 1_000_000, 10_000, 40*time.Minute
	}
	chaosOrdered(t, dialect.Postgres, testenv.PostgresDSN(t), numEvents, numAggs, budget, nil)
}

// TestOutageChaosOrderedMariaDB is the chaos test on MariaDB, smaller: the
// same relays, kills, broker restart and checks, on a fifth of the load.
func TestOutageChaosOrderedMariaDB(t *testing.T) {
	tier.SkipShort(t)
	numEvents, numAggs := 20_000, 200
	budget := 3 * time.Minute
	if os.Getenv("TXOUTBOX_SOAK") != "" || tier.Long() {
		numEvents, numAggs, budget = 200_000, 2_000, 20*time.Minute
	}
	chaosOrdered(t, dialect.MySQL, testenv.MySQLDSN(t), numEvents, numAggs, budget, nil)
}

// TestOutageChaosLog is the chaos test in log mode (package logrelay), on
// a PostgreSQL cluster of its own: three relay processes on one slot (one
// streams, two stand by), the streaming one SIGKILLed again and again and a
// standby taking over, PostgreSQL crashed (pg_ctl stop -m immediate) and
// started once, RabbitMQ restarted once, 10 % of publishes refused (those
// events take the table's retry path, and in ordered mode their
// aggregates' later events follow them). Checked: nothing lost, no
// reordering, every takeover within the bound.
func TestOutageChaosLog(t *testing.T) {
	tier.SkipShort(t)
	numEvents, numAggs := 24_000, 1_200
	budget := 4 * time.Minute
	if os.Getenv("TXOUTBOX_SOAK") != "" || tier.Long() {
		numEvents, numAggs, budget = 400_000, 20_000, 30*time.Minute
	}
	cl := testenv.StartCluster(t)
	chaosOrdered(t, dialect.Postgres, cl.NewDatabase(t), numEvents, numAggs, budget, &logChaos{slot: "chaos", cluster: cl})
}

// logChaos is what the chaos test adds in log mode.
type logChaos struct {
	slot    string
	cluster *testenv.Cluster // crashed and started once, mid-run
}

// streamLog records which relay started streaming the slot, when.
type streamLog struct {
	mu     sync.Mutex
	owner  string // streaming now, as far as the relays said
	starts []streamStart
}

type streamStart struct {
	owner string
	at    time.Time
}

func (l *streamLog) on(owner string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.owner = owner
	l.starts = append(l.starts, streamStart{owner, time.Now()})
}

func (l *streamLog) off(owner string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.owner == owner {
		l.owner = ""
	}
}

func (l *streamLog) streaming() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.owner
}

// takenOver returns how long after since another relay than owner started
// streaming, or false.
func (l *streamLog) takenOver(owner string, since time.Time) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.starts {
		if s.owner != owner && !s.at.Before(since) {
			return s.at.Sub(since), true
		}
	}
	return 0, false
}

// chaosDriver is the database/sql driver of a dialect of the chaos test.
func chaosDriver(d dialect.Dialect) string {
	if d == dialect.MySQL {
		return "mysql"
	}
	return "pgx"
}

func chaosOrdered(t *testing.T, d dialect.Dialect, dsn string, numEvents, numAggs int, budget time.Duration, lm *logChaos) {
	amqpURL := testenv.AMQPURL(t)
	testenv.Env(t, "TXOUTBOX_RABBITMQCTL")
	db, err := sql.Open(chaosDriver(d), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	mopts := dialect.MigrateOptions{SkipInbox: true, Logger: slog.New(slog.DiscardHandler)}
	if err := dialect.Migrate(ctx, db, d, mopts); err != nil {
		t.Fatal(err)
	}
	var streams streamLog
	if lm != nil {
		names := logrelay.Names{Slot: lm.slot, Publication: lm.slot}
		if err := logrelay.Setup(ctx, dsn, names); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = logrelay.Teardown(context.Background(), dsn, names, logrelay.TeardownOptions{Force: true}) })
	}
	leases, err := ordered.NewLeaser(db, d, ordered.LeaserOptions{PartitionCount: chaosPartitions, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	bin := buildChaosRelay(t)

	// The events, in enqueue order: event i is the (i / numAggs)-th of
	// aggregate i % numAggs.
	topic := "chaos.ordered." + testenv.RandomSuffix()
	consumer := "chaos-" + testenv.RandomSuffix()
	evs := make([]core.Event, numEvents)
	index := make(map[string]int32, numEvents)
	for i := range evs {
		agg := fmt.Sprintf("agg-%05d", i%numAggs)
		ev, err := core.NewEvent("chaos", agg, topic, map[string]int{"n": i / numAggs})
		if err != nil {
			t.Fatal(err)
		}
		if err := ev.Prepare(); err != nil {
			t.Fatal(err)
		}
		evs[i] = ev
		index[ev.ID] = int32(i)
	}
	keep := numEvents <= 100_000 // keep deliveries for outboxtest.CheckAggregateOrder
	cons := startChaosConsumer(t, amqpURL, consumer, topic, index, numAggs, keep)

	// The relays.
	logDir := t.TempDir()
	var takeovers atomic.Int64
	relays := make([]*chaosRelay, chaosRelays)
	start := func(slot int) {
		prev := relays[slot]
		gen := 1
		if prev != nil {
			gen = prev.gen + 1
		}
		r := &chaosRelay{slot: slot, gen: gen, owner: fmt.Sprintf("relay%d-gen%d", slot, gen), done: make(chan struct{}), streams: &streams}
		env := map[string]string{
			"CHAOS_DIALECT":              d.Name(),
			"CHAOS_DSN":                  dsn,
			"CHAOS_AMQP_URL":             amqpURL,
			"CHAOS_CONSUMER":             consumer,
			"CHAOS_OWNER":                r.owner,
			"CHAOS_PARTITIONS":           fmt.Sprint(chaosPartitions),
			"CHAOS_LEASE_TTL_MS":         fmt.Sprint(chaosLeaseTTL.Milliseconds()),
			"CHAOS_BATCH":                fmt.Sprint(chaosBatch),
			"CHAOS_FAIL_RATE":            fmt.Sprint(chaosFailRate),
			"CHAOS_FAIL_AFTER_SEND_RATE": fmt.Sprint(chaosLieRate),
		}
		if lm != nil {
			env["CHAOS_MODE"], env["CHAOS_SLOT"] = "log", lm.slot
		}
		r.start(t, bin, logDir, env, &takeovers)
		relays[slot] = r
	}
	for i := range relays {
		start(i)
	}
	defer func() {
		for _, r := range relays {
			r.stop(syscall.SIGKILL)
		}
		if t.Failed() {
			dumpLogs(t, logDir)
		}
	}()

	// The producer writes in batches while the chaos goes on, one writer,
	// so that Seq order is enqueue order.
	var produced atomic.Int64
	prodErr := make(chan error, 1)
	go func() {
		q, err := d.Queries("")
		if err != nil {
			prodErr <- err
			return
		}
		// About a hundred batches, 100 ms apart: production lasts ~10 s
		// whatever the size (~10k events/s at 100k), so the relays lag and
		// the kills and the broker restart meet a backlog. (MariaDB's form
		// once wrote its 20k events in 2 s, and they had all arrived
		// before the first kill was due.)
		batch := min(1000, max(100, numEvents/100))
		const pace = 100 * time.Millisecond
		if lm != nil {
			// ~2k events/s, so that the kills, the crash and the broker
			// restart meet the stream, not a table full of failed events.
			batch = 200
		}
		for i := 0; i < numEvents; i += batch {
			query, args, err := q.Insert(evs[i:min(i+batch, numEvents)])
			if err != nil {
				prodErr <- err
				return
			}
			// While the database restarts (log mode's crash) the insert
			// fails; it is retried. One whose commit was lost with the
			// connection may have committed: its events then arrive twice,
			// which the consumer counts as duplicates.
			for tries := 0; ; tries++ {
				if _, err = db.ExecContext(ctx, query, args...); err == nil {
					break
				}
				if lm == nil || tries == 300 {
					prodErr <- fmt.Errorf("enqueue events %d..: %w", i, err)
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
			produced.Store(int64(min(i+batch, numEvents)))
			time.Sleep(pace)
		}
		prodErr <- nil
	}()

	// Chaos, until 95 % arrived: SIGKILL a random relay every 3-6 s
	// (1.5-3 s in log mode), keeping at least one alive, and restart it
	// 0.5-3 s later; restart the broker once, after the first kill and
	// when 30 % were written.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	began := time.Now()
	deadline := began.Add(budget)
	killLo, killHi := 3*time.Second, 6*time.Second
	if lm != nil {
		killLo, killHi = 1500*time.Millisecond, 3*time.Second // a shorter run
	}
	nextKill := began.Add(jitter(rng, killLo, killHi))
	restartAt := map[int]time.Time{}
	brokerRestarted := false
	brokerDown := false
	crashed := lm == nil // only log mode crashes the database
	defer func() {
		if brokerDown {
			testenv.RabbitMQCtl(t, "start_app")
		}
	}()
	var kills, streamKills int
	nextReport := began.Add(10 * time.Second)
	var failovers []time.Duration
	var fmu sync.Mutex
	var fwg sync.WaitGroup
	// The budget is a liveness limit: the events keep arriving, or the
	// run fails once they stall.
	lastCount, lastMove := int64(-1), time.Now()
	for cons.firstCount() < int64(numEvents) {
		now := time.Now()
		if n := cons.firstCount(); n != lastCount {
			lastCount, lastMove = n, now
		}
		if now.After(deadline) && now.Sub(lastMove) >= wait.Stall {
			t.Fatalf("after %v only %d of %d events arrived (produced %d), none for %v", now.Sub(began), cons.firstCount(), numEvents, produced.Load(), wait.Stall)
		}
		select {
		case err := <-prodErr:
			if err != nil {
				t.Fatal(err)
			}
		default:
		}
		// The broker restart blocks this loop for ~5-15 s, so it waits for
		// the first kill: a run must not drain its backlog while no relay
		// can be killed.
		if !brokerRestarted && kills > 0 && produced.Load() >= int64(numEvents*3/10) {
			t.Logf("%v: restarting RabbitMQ (%d arrived)", time.Since(began).Round(time.Millisecond), cons.firstCount())
			brokerDown = true
			testenv.RabbitMQCtl(t, "stop_app")
			time.Sleep(3 * time.Second)
			testenv.RabbitMQCtl(t, "start_app")
			testenv.RabbitMQCtl(t, "await_startup")
			brokerDown, brokerRestarted = false, true
		}
		if !crashed && produced.Load() >= int64(numEvents*6/10) {
			t.Logf("%v: crashing PostgreSQL (pg_ctl stop -m immediate), starting it again (%d arrived)", time.Since(began).Round(time.Millisecond), cons.firstCount())
			lm.cluster.Crash(t)
			time.Sleep(time.Second)
			lm.cluster.Start(t)
			crashed = true
			// Drop the pool's connections to the crashed server.
			db.SetMaxIdleConns(0)
			db.SetMaxIdleConns(2)
		}
		chaos := cons.firstCount() < int64(numEvents)*95/100
		if chaos && now.After(nextKill) {
			nextKill = now.Add(jitter(rng, killLo, killHi))
			var alive []int
			for i, r := range relays {
				if _, down := restartAt[i]; !down && r.running() {
					alive = append(alive, i)
				}
			}
			if len(alive) >= 2 {
				victim := relays[alive[rng.IntN(len(alive))]]
				if lm != nil && (streamKills == 0 || rng.IntN(3) > 0) {
					// Mostly the streaming relay: its loss is log mode's
					// failover.
					for _, i := range alive {
						if relays[i].owner == streams.streaming() {
							victim = relays[i]
						}
					}
				}
				var held []int
				if lm == nil {
					held = heldBy(t, leases, victim.owner)
				}
				wasStreaming := lm != nil && streams.streaming() == victim.owner
				victim.stop(syscall.SIGKILL)
				killedAt := time.Now()
				kills++
				restartAt[victim.slot] = killedAt.Add(jitter(rng, 500*time.Millisecond, 3*time.Second))
				switch {
				case wasStreaming:
					streamKills++
					fwg.Add(1)
					go func() {
						defer fwg.Done()
						took := 30 * time.Second
						for time.Since(killedAt) < took {
							if d, ok := streams.takenOver(victim.owner, killedAt); ok {
								took = d
								break
							}
							time.Sleep(20 * time.Millisecond)
						}
						fmu.Lock()
						failovers = append(failovers, took)
						fmu.Unlock()
					}()
				case lm == nil && len(held) > 0:
					fwg.Add(1)
					go func() {
						defer fwg.Done()
						took := waitTakeover(leases, victim.owner, held, killedAt, failoverLiveness)
						fmu.Lock()
						failovers = append(failovers, took)
						fmu.Unlock()
					}()
				}
			}
		}
		for slot, at := range restartAt {
			if now.After(at) {
				start(slot)
				delete(restartAt, slot)
			}
		}
		if now.After(nextReport) {
			nextReport = now.Add(10 * time.Second)
			t.Logf("%v: %d written, %d arrived, %d kills", time.Since(began).Round(time.Second), produced.Load(), cons.firstCount(), kills)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for slot := range restartAt {
		start(slot)
	}
	if !brokerRestarted || !crashed {
		t.Fatal("the broker was never restarted, or the database never crashed: the test proves less than it claims")
	}
	// Every event arrived; the outbox must also record every one published
	// (the marks of a killed relay's last batch come from its successor).
	wait.Until(t, "every event marked published", func() bool {
		var pending int
		if err := db.QueryRow("SELECT count(*) FROM outbox_events WHERE published_at IS NULL").Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending != 0 || lm == nil {
			return pending == 0
		}

		var behind int64
		if err := db.QueryRow("SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint FROM pg_replication_slots WHERE slot_name = $1", lm.slot).Scan(&behind); err != nil {
			t.Fatal(err)
		}
		return behind <= 0
	})
	elapsed := time.Since(began)
	var dead int
	if err := db.QueryRow("SELECT count(*) FROM outbox_events WHERE dead_at IS NOT NULL").Scan(&dead); err != nil {
		t.Fatal(err)
	}
	var attempts int64
	if err := db.QueryRow("SELECT coalesce(sum(attempt_count), 0) FROM outbox_events").Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	// A kill just before the last events arrived is still being taken
	// over: stopping the relays now would leave its measure at the limit.
	fwg.Wait()
	for _, r := range relays {
		r.stop(syscall.SIGTERM)
	}
	time.Sleep(500 * time.Millisecond) // late redeliveries still count
	cons.close()

	st := cons.stats()
	lost := int64(numEvents) - st.first
	var maxFailover time.Duration
	for _, d := range failovers {
		maxFailover = max(maxFailover, d)
	}
	t.Logf("chaos: %d events over %d aggregates in %v; delivered %d, duplicates %d, reorderings %d, lost %d, unknown %d",
		numEvents, numAggs, elapsed.Round(time.Millisecond), st.delivered, st.dups, st.reorders, lost, st.unknown)
	t.Logf("chaos: %d relay kills (SIGKILL), %d failovers measured (max %v), %d partitions taken over from dead relays; broker restarted once; %d publish attempts for %d events; %d dead",
		kills, len(failovers), maxFailover.Round(time.Millisecond), takeovers.Load(), attempts, numEvents, dead)
	if st.reorders != 0 {
		t.Errorf("%d reorderings; first: %s", st.reorders, st.firstReorder)
	}
	if lost != 0 || dead != 0 {
		t.Errorf("lost %d events, %d dead", lost, dead)
	}
	if st.unknown != 0 {
		t.Errorf("%d messages with an unknown event_id", st.unknown)
	}
	bound := chaosFailoverBound
	if lm != nil {
		bound = logFailoverBound
		streams.mu.Lock()
		t.Logf("chaos: log mode: %d kills of the streaming relay, %d stream starts over all relays; %d of the %d events went through the table's retry path", streamKills, len(streams.starts), rowsOf(t, db), numEvents)
		streams.mu.Unlock()
	}
	if kills == 0 || len(failovers) == 0 || (lm == nil && takeovers.Load() == 0) {
		t.Errorf("%d kills, %d failovers measured, %d takeovers: the chaos did not happen", kills, len(failovers), takeovers.Load())
	}
	// A failover that never came is a wrong result; how long one took
	// depends on the machine's load, so the long tier alone bounds it.
	if maxFailover >= failoverLiveness {
		t.Errorf("a dead relay's partitions were never taken over (waited %v)", failoverLiveness)
	}
	if tier.Long() && maxFailover > bound {
		t.Errorf("a failover took %v, above the bound %v", maxFailover, bound)
	}
	t.Logf("chaos: the longest failover took %v (the long tier's bound: %v)", maxFailover, bound)
	switch {
	case lm == nil && attempts <= int64(numEvents):
		t.Errorf("%d attempts for %d events: no failure was injected", attempts, numEvents)
	case lm != nil && attempts == 0:
		t.Errorf("no event took the table's retry path: no failure was injected")
	}
	if keep {
		if err := outboxtest.CheckAggregateOrder(evs, cons.received()); err != nil {
			t.Error(err)
		}
	}
}

// failoverLiveness is how long a failover may take before it counts as
// never coming: far above any correct run's.
const failoverLiveness = 2 * time.Minute

// chaosFailoverBound is the longest a dead relay's partitions may wait: the
// lease TTL, one renew interval, and slack for a loaded 2-core CI machine.
const chaosFailoverBound = chaosLeaseTTL + chaosLeaseTTL/3 + 3*time.Second

// logFailoverBound is the longest log mode's slot may go unstreamed after
// its relay was killed: the server notices the closed connection at once,
// a standby retries every second (logmode.Options.StandbyInterval), plus
// slack for a loaded 2-core CI machine.
const logFailoverBound = 5 * time.Second

// rowsOf counts the outbox table's rows: in log mode, the events that took
// the retry path.
func rowsOf(t *testing.T, db *sql.DB) int64 {
	var n int64
	if err := db.QueryRow("SELECT count(*) FROM outbox_events").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func jitter(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// buildChaosRelay builds the relay program once per test run.
func buildChaosRelay(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "chaosrelay")
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	// With -race, as the test binaries: the build shares make test's
	// compiled packages, and the relays' races are found too.
	cmd := exec.Command(goTool, "build", "-race", "-ldflags=-s -w", "-o", bin, "github.com/txoutbox/txoutbox/internal/testkit/chaosrelay")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the relay program: %v\n%s", err, out)
	}
	return bin
}

type chaosRelay struct {
	slot, gen int
	owner     string
	streams   *streamLog
	cmd       *exec.Cmd
	done      chan struct{}
}

func (r *chaosRelay) start(t *testing.T, bin, logDir string, env map[string]string, takeovers *atomic.Int64) {
	t.Helper()
	r.cmd = exec.Command(bin)
	r.cmd.Env = os.Environ()
	for k, v := range env {
		r.cmd.Env = append(r.cmd.Env, k+"="+v)
	}
	logf, err := os.Create(filepath.Join(logDir, r.owner+".log"))
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stderr = logf
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("start relay %s: %v", r.owner, err)
	}
	go func() {
		// "lease acquired <partition> <from>": a takeover when from is
		// another relay (all owners are distinct per process start).
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 4 && f[0] == "lease" && f[1] == "acquired" && f[3] != "-" && f[3] != r.owner {
				takeovers.Add(1)
			}
			if len(f) == 2 && f[0] == "stream" {
				if f[1] == "on" {
					r.streams.on(r.owner)
				} else {
					r.streams.off(r.owner)
				}
			}
		}
		_ = r.cmd.Wait()
		logf.Close()
		close(r.done)
	}()
}

func (r *chaosRelay) running() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

func (r *chaosRelay) stop(sig syscall.Signal) {
	if r == nil || !r.running() {
		return
	}
	_ = r.cmd.Process.Signal(sig)
	select {
	case <-r.done:
	case <-time.After(15 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

func dumpLogs(t *testing.T, dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		t.Logf("--- %s (last lines)\n%s", filepath.Base(f), strings.Join(lines[max(0, len(lines)-15):], "\n"))
	}
}

// heldBy returns the partitions owner holds live leases on.
func heldBy(t *testing.T, leases *ordered.Leaser, owner string) []int {
	t.Helper()
	all, err := leases.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ps []int
	for _, le := range all {
		if le.Owner == owner && le.Live {
			ps = append(ps, le.Partition)
		}
	}
	return ps
}

// waitTakeover waits until every partition of held is leased, live, to a
// relay other than owner, and returns how long after since that took (limit
// if it did not happen by then).
func waitTakeover(leases *ordered.Leaser, owner string, held []int, since time.Time, limit time.Duration) time.Duration {
	for time.Since(since) < limit {
		all, err := leases.Leases(context.Background())
		waiting := 0
		for _, le := range all {
			if slices.Contains(held, le.Partition) && (!le.Live || le.Owner == owner) {
				waiting++
			}
		}
		if err == nil && waiting == 0 {
			return time.Since(since)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return limit
}

// chaosConsumer reads the test's queue and checks order as messages come:
// a reordering is a first delivery of an aggregate's event before the first
// delivery of every earlier one. It uses amqp091-go directly, re-dialling
// after the broker restart, so that nothing between the queue and the check
// could reorder or hide a message.
type chaosConsumer struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu           sync.Mutex
	index        map[string]int32
	numAggs      int
	seen         []bool
	expect       []int32 // per aggregate: position of the next first delivery
	first        atomic.Int64
	delivered    int64
	dups         int64
	reorders     int64
	unknown      int64
	firstReorder string
	keep         bool
	got          []outboxtest.Received
}

// declareChaosQueue declares the topology brokers/amqp uses by default (a
// durable fanout exchange named after the topic, the consumer's durable
// queue bound to it), so that nothing the relays publish is dropped.
func declareChaosQueue(ch *amqp.Channel, queue, topic string) error {
	if err := ch.ExchangeDeclare(topic, "fanout", true, false, false, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return err
	}
	return ch.QueueBind(queue, topic, topic, false, nil)
}

func startChaosConsumer(t *testing.T, url, consumer, topic string, index map[string]int32, numAggs int, keep bool) *chaosConsumer {
	t.Helper()
	queue := consumer + "." + topic
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("connect consumer: %v", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = declareChaosQueue(ch, queue, topic)
	}
	if err != nil {
		conn.Close()
		t.Fatalf("declare the test's queue: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &chaosConsumer{cancel: cancel, done: make(chan struct{}), index: index, numAggs: numAggs,
		seen: make([]bool, len(index)), expect: make([]int32, numAggs), keep: keep}
	go func() {
		defer close(c.done)
		for ctx.Err() == nil {
			if conn == nil || conn.IsClosed() {
				if conn, err = amqp.Dial(url); err != nil {
					conn = nil
					select {
					case <-ctx.Done():
					case <-time.After(200 * time.Millisecond):
					}
					continue
				}
			}
			c.consume(ctx, conn, queue)
		}
		if conn != nil {
			conn.Close()
		}
	}()
	t.Cleanup(c.close)
	return c
}

// consume reads deliveries until the connection or ctx ends.
func (c *chaosConsumer) consume(ctx context.Context, conn *amqp.Connection, queue string) {
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return
	}
	defer ch.Close()
	if err := ch.Qos(500, 0, false); err != nil {
		return
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case d, ok := <-deliveries:
			if !ok {
				return
			}
			id, _ := d.Headers[core.HeaderEventID].(string)
			agg, _ := d.Headers[core.HeaderAggregateID].(string)
			c.observe(id, agg)
			_ = d.Ack(false)
		}
	}
}

func (c *chaosConsumer) observe(id, agg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.delivered++
	i, ok := c.index[id]
	if !ok {
		c.unknown++
		return
	}
	if c.keep {
		c.got = append(c.got, outboxtest.Received{UUID: id, Metadata: map[string]string{core.HeaderEventID: id, core.HeaderAggregateID: agg}})
	}
	if c.seen[i] {
		c.dups++
		return
	}
	c.seen[i] = true
	c.first.Add(1)
	a, pos := int(i)%c.numAggs, i/int32(c.numAggs)
	if pos != c.expect[a] {
		c.reorders++
		if c.firstReorder == "" {
			c.firstReorder = fmt.Sprintf("aggregate %s: event #%d arrived when #%d was due", agg, pos, c.expect[a])
		}
	}
	c.expect[a] = max(c.expect[a], pos+1)
}

func (c *chaosConsumer) firstCount() int64 { return c.first.Load() }

type consumerStats struct {
	delivered, first, dups, reorders, unknown int64
	firstReorder                              string
}

func (c *chaosConsumer) stats() consumerStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return consumerStats{c.delivered, c.first.Load(), c.dups, c.reorders, c.unknown, c.firstReorder}
}

func (c *chaosConsumer) received() []outboxtest.Received {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.got
}

func (c *chaosConsumer) close() {
	c.cancel()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
	}
}
