package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/internal/mysqldsn"
	"github.com/txoutbox/txoutbox/internal/testkit/logbuf"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/tier"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/logrelay"
)

// Log mode confirms its position as the broker confirms: two log relays
// on one stream, the streaming one SIGKILLed every 1-1.6 s of events
// (500-800 events; 1.5-2.5 s in the long tier) and started again, producers
// committing 500 events/s.
// Nothing is lost, the standing-by relay takes over, and what a takeover
// sends again is the tail of what the killed relay published, from the
// position it had confirmed. The long tier also bounds the amount: below
// 1 % of the events, at most 200 ms of events after one kill.
func TestLogModeKillsSendLittleAgain(t *testing.T) {
	tier.SkipShort(t)
	t.Parallel()
	for _, db := range []string{"postgres", "mariadb"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			dsn, driver, driverDSN, modeArgs := logModeDatabase(t, db)
			f := openFixture(t, driver, driverDSN, dsn)
			relayArgs := append([]string{"--mode", "log", "--broker", "log://", "--stats-interval", "100ms"}, modeArgs...)
			type proc struct {
				cmd    *exec.Cmd
				stdout *logbuf.Buffer
				addr   string
			}
			start := func() *proc {
				cmd, stdout, _, addr := startRelay(t, dsn, relayArgs...)
				return &proc{cmd, stdout, addr}
			}
			streaming := func(p *proc) bool {
				resp, err := http.Get("http://" + p.addr + "/metrics")
				if err != nil {
					return false
				}
				defer resp.Body.Close()
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					if sc.Text() == "txoutbox_log_streaming 1" {
						return true
					}
				}
				return false
			}
			relays := []*proc{start(), start()}
			wait.Until(t, "a relay to stream", func() bool { return streaming(relays[0]) || streaming(relays[1]) })

			// 500 events/s, one per transaction, until the kills are done
			// and gap more events are out.
			const rate = 500
			want, gap, jitter := 3, rate, rate*3/5 // a kill every 1-1.6 s of events
			if tier.Long() {
				want, gap, jitter = 5, rate*3/2, rate // every 1.5-2.5 s
			}
			var produced atomic.Int64
			stopProducing, prodDone := make(chan struct{}), make(chan struct{})
			var prodErr error
			go func() {
				defer close(prodDone)
				tick := time.NewTicker(time.Second / rate)
				defer tick.Stop()
				for i := 0; ; i++ {
					select {
					case <-stopProducing:
						return
					case <-tick.C:
					}
					ev, err := core.NewEvent("order", fmt.Sprintf("o-%d", i%7), "order.created", map[string]int{"n": i})
					if err == nil {
						err = enqueueOne(f, ev)
					}
					if err != nil {
						prodErr = err
						return
					}
					produced.Add(1)
				}
			}()
			var outputs []*logbuf.Buffer // of every relay process, killed or not
			var kills []int              // index in outputs of each killed process
			var takeovers []time.Duration
			for _, p := range relays {
				outputs = append(outputs, p.stdout)
			}
			// gap to gap+jitter events between kills, counted in events
			// rather than seconds: a loaded machine that slows the producer
			// must not make the kills more frequent per event than the long
			// tier's bound assumes.
			awaitEvents := func(what string, n int64) {
				at := produced.Load() + n
				wait.For(t, fmt.Sprintf("%d events produced %s", at, what), func() (bool, any) {
					select {
					case <-prodDone:
						t.Fatalf("the producer stopped: %v", prodErr)
					default:
					}
					return produced.Load() >= at, produced.Load()
				})
			}
			for len(kills) < want {
				awaitEvents(fmt.Sprintf("before kill %d", len(kills)+1), int64(gap)+time.Now().UnixNano()%int64(jitter))
				for i, p := range relays {
					if !streaming(p) {
						continue
					}
					_ = p.cmd.Process.Signal(syscall.SIGKILL)
					killedAt := time.Now()
					_ = p.cmd.Wait()
					// The other relay, standing by, takes over.
					other := relays[1-i]
					wait.Until(t, "the standing-by relay to take over", func() bool { return streaming(other) })
					takeovers = append(takeovers, time.Since(killedAt))
					for k, o := range outputs {
						if o == p.stdout {
							kills = append(kills, k)
						}
					}
					relays[i] = start()
					outputs = append(outputs, relays[i].stdout)
					break
				}
			}
			awaitEvents("after the last kill", int64(gap))
			close(stopProducing)
			<-prodDone
			if prodErr != nil {
				t.Fatal(prodErr)
			}
			// Every event out, then count what came out twice.
			total := int(produced.Load())
			var seen map[string]int
			var firstBy map[string]int
			wait.Until(t, "every event published", func() bool {
				seen, firstBy = map[string]int{}, map[string]int{}
				for k, o := range outputs {
					for _, id := range sinkIDsLenient(o.String()) {
						if _, ok := firstBy[id]; !ok {
							firstBy[id] = k
						}
						seen[id]++
					}
				}
				return len(seen) >= total
			})
			dups := 0
			for _, n := range seen {
				dups += n - 1
			}
			// Per kill: what the killed process printed that a later one
			// printed again.
			worst := 0
			for _, k := range kills {
				again := 0
				for _, id := range sinkIDsLenient(outputs[k].String()) {
					if seen[id] > 1 && firstBy[id] == k {
						again++
					}
				}
				worst = max(worst, again)
			}
			t.Logf("%s: %d events, %d streaming relays SIGKILLed, %d sent again (%.2f %%), at most %d after one kill",
				db, total, len(kills), dups, 100*float64(dups)/float64(total), worst)
			pairs := map[[2]int]int{}
			for k, o := range outputs {
				for _, id := range sinkIDsLenient(o.String()) {
					if seen[id] > 1 && firstBy[id] != k {
						pairs[[2]int{firstBy[id], k}]++
					}
				}
			}
			t.Logf("sent again, by (first process, later process): %v; killed: %v", pairs, kills)
			slices.Sort(takeovers)
			t.Logf("takeovers after SIGKILL: %v", takeovers)
			// What a takeover sends again starts at the position the killed
			// relay had confirmed: it is the tail of what that relay
			// published, never an event from before one it confirmed.
			for _, k := range kills {
				ids := sinkIDsLenient(outputs[k].String())
				first := slices.IndexFunc(ids, func(id string) bool { return seen[id] > 1 && firstBy[id] == k })
				if first < 0 {
					continue
				}
				for _, id := range ids[first:] {
					if seen[id] == 1 {
						t.Errorf("process %d: event %s, published after one it sent again (%s), was not sent again: the successor skipped or the killed relay confirmed out of order",
							k, id, ids[first])
						break
					}
				}
			}
			// How much a kill sends again depends on where the kill lands
			// and on the machine's load: a figure, bounded in the long
			// tier only.
			if tier.Long() {
				if float64(dups) >= 0.01*float64(total) {
					t.Errorf("%d of %d events sent again after %d kills: over 1 %%", dups, total, len(kills))
				}
				if limit := rate / 5; worst > limit {
					t.Errorf("one takeover sent %d events again, over the last 200 ms of events (%d)", worst, limit)
				}
			}
		})
	}
}

// sinkIDsLenient is sinkIDs over a killed process's output: a last line
// cut off by the kill is not an event.
func sinkIDsLenient(out string) []string {
	var ids []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var l sinkLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.EventID != "" {
			ids = append(ids, l.EventID)
		}
	}
	return ids
}

// logModeDatabase makes a database of db (postgres or mariadb) in log mode
// and returns its DSN for the CLI, the driver and DSN for the test's own
// pool, and the relay's flags naming the slot or stream.
func logModeDatabase(t *testing.T, db string) (dsn, driver, driverDSN string, args []string) {
	t.Helper()
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	name := "kill_" + hex.EncodeToString(b)
	if db == "postgres" {
		dsn = testenv.PostgresDSN(t)
		names := logrelay.Names{Slot: name, Publication: name}
		t.Cleanup(func() { _ = logrelay.Teardown(context.Background(), dsn, names, logrelay.TeardownOptions{Force: true}) })
		ok(t, dsn, "migrate", "--mode", "log", "--slot", name, "--publication", name)
		return dsn, "pgx", dsn, []string{"--slot", name, "--publication", name}
	}
	driverDSN = testenv.MySQLDSN(t)
	cfg, err := mysqldsn.Config(driverDSN)
	if err != nil {
		t.Fatal(err)
	}
	dsn = "mysql://" + url.UserPassword(cfg.User, cfg.Passwd).String() + "@" + cfg.Addr + "/" + cfg.DBName
	ok(t, dsn, "migrate", "--mode", "log", "--stream", name)
	return dsn, "mysql", driverDSN, []string{"--stream", name}
}

// enqueueOne commits ev in a transaction of its own.
func enqueueOne(f *fixture, ev core.Event) error {
	ctx := context.Background()
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f.ob.Enqueue(ctx, tx, ev); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}
