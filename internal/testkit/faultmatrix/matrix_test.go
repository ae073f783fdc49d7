package faultmatrix_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/twmb/franz-go/pkg/kfake"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	"github.com/txoutbox/txoutbox/binlogrelay"
	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	natsbroker "github.com/txoutbox/txoutbox/brokers/nats"
	snsbroker "github.com/txoutbox/txoutbox/brokers/sns"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/logbuf"
	"github.com/txoutbox/txoutbox/internal/testkit/sqstest"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/tier"
	"github.com/txoutbox/txoutbox/internal/testkit/wait"
	"github.com/txoutbox/txoutbox/logrelay"
	outboxtest "github.com/txoutbox/txoutbox/testing"
	"github.com/txoutbox/txoutbox/testing/faultproxy"
	"github.com/txoutbox/txoutbox/testing/sqlfixture"
)

var quiet = slog.New(slog.DiscardHandler)

// long is the full matrix: longer faults, more events (TXOUTBOX_FAULTS=long).
var long = os.Getenv("TXOUTBOX_FAULTS") == "long" || tier.Long()

// cell is what one run of the matrix needs: the proxies in front of the
// relay's database and of the broker.
type cell struct {
	db, broker *faultproxy.Proxy
	// dsn is the outbox database's (direct); brokerURL the broker's, as
	// the CLI takes it; producers is the producers' pool.
	dsn, brokerURL string
	producers      *sql.DB
	held           []*sql.Conn
	relay          *exec.Cmd
	relayLog       *logbuf.Buffer // the output of the latest relay process
	// logAtInject is how much the relay had logged when the fault began.
	logAtInject int
	httpAddr    string // its /healthz and /metrics
	relayDSN    string // the relay's database, through c.db
	ordering    string
	// server, when set, is the crashable server the outbox lives on: a
	// PostgreSQL cluster, or a MariaDB server (backendMariaDB).
	server crashable
	// backend is where the outbox is, and how it is relayed.
	backend backend
	// slot is log mode's replication slot (backendLog), or its stream
	// (backendBinlog).
	slot string
	// env is added to the relay process's environment.
	env []string
	// The in-process Kafka cluster, and what restarts it (kafkaRestart:
	// on disk, for the restart fault).
	kfake        *kfake.Cluster
	kfakeOpts    []kfake.Opt
	kafkaRestart bool
	// The cell's own nats-server (NATS rows), which the restart fault
	// stops and starts on its JetStream storage.
	nats *testenv.NATS
	// The cell's own PgBouncer (backendPgBouncer), which the pooler fault
	// stops and starts.
	bouncer *testenv.PgBouncer
	// The consumer process (consumer SIGKILL): its inbox database, how it
	// reaches the broker and as which group, what it consumes, and where
	// it reports deliveries.
	inboxDSN, consumerBroker, consumerGroup string
	goaws                                   *sqstest.Goaws // SNS: where the consumer's queue is
	consumerEnv                             []string
	consumerTopic, consumerName             string
	delivered                               func(eventID string)
	consumer                                *exec.Cmd
	consumerDone                            chan struct{} // its output read to the end
}

// backend is where a cell's outbox is and how the relay reads it.
type backend int

const (
	backendPostgres backend = iota // PostgreSQL, table mode
	backendMariaDB                 // MariaDB, table mode
	backendLog                     // PostgreSQL, log mode (package logrelay)
	backendBinlog                  // MariaDB, log mode from the binlog (package binlogrelay)
	// PostgreSQL, table mode, producers, relay and consumer through a
	// PgBouncer of the cell's own in transaction pooling mode.
	backendPgBouncer
)

// store makes a fresh PostgreSQL outbox whose producers write directly and
// whose relay reads through c.db.
func (c *cell) store(t *testing.T) *outboxtest.StoreFixture {
	if c.backend == backendMariaDB || c.backend == backendBinlog {
		return c.mariaDBStore(t)
	}
	var dsn string
	if c.server != nil {
		dsn = c.server.NewDatabase(t)
	} else {
		dsn = testenv.PostgresDSN(t)
	}
	if c.backend == backendPgBouncer {
		u, _ := url.Parse(dsn)
		c.bouncer = testenv.StartPgBouncer(t, u.Host)
		dsn = c.bouncer.DSN(strings.TrimPrefix(u.Path, "/"))
	}
	direct, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	// A pool the "pool exhausted" fault can take whole.
	direct.SetMaxOpenConns(4)
	direct.SetMaxIdleConns(4)
	c.dsn, c.producers = dsn, direct
	fx := sqlfixture.New(t, direct, dialect.Postgres, sqlfixture.Options{SkipInbox: true})
	u, _ := url.Parse(dsn)
	c.db = faultproxy.Start(t, u.Host)
	u.Host = c.db.Addr()
	// Connections that wait for a blackholed server give up; the pool
	// dials again once it is back.
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	c.relayDSN = u.String()
	proxied, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxied.Close() })
	ob, err := sqlxoutbox.NewDB(proxied, sqlxoutbox.Options{Dialect: dialect.Postgres, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if c.backend == backendLog {
		c.slot = "fault_" + testenv.RandomSuffix()
		names := logrelay.Names{Slot: c.slot, Publication: c.slot}
		if err := logrelay.Setup(t.Context(), dsn, names); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // before the database is dropped
			_ = logrelay.Teardown(context.Background(), dsn, names, logrelay.TeardownOptions{Force: true})
		})
	}
	return fx.StoreFixture(ob)
}

// mariaDBStore is store on MariaDB: producers direct, the relay through
// c.db.
func (c *cell) mariaDBStore(t *testing.T) *outboxtest.StoreFixture {
	var dsn string
	if c.server != nil {
		dsn = c.server.NewDatabase(t)
	} else {
		dsn = testenv.MySQLDSN(t)
	}
	direct, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	direct.SetMaxOpenConns(4)
	direct.SetMaxIdleConns(4)
	c.dsn, c.producers = dsn, direct
	fx := sqlfixture.New(t, direct, dialect.MySQL, sqlfixture.Options{SkipInbox: true})
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	c.db = faultproxy.Start(t, cfg.Addr)
	cfg.Addr = c.db.Addr()
	cfg.Timeout = 2 * time.Second
	c.relayDSN = cfg.FormatDSN()
	proxied, err := sql.Open("mysql", c.relayDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxied.Close() })
	ob, err := sqlxoutbox.NewDB(proxied, sqlxoutbox.Options{Dialect: dialect.MySQL, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if c.backend == backendBinlog {
		c.slot = "fault_" + testenv.RandomSuffix()
		if err := binlogrelay.Setup(t.Context(), dsn, binlogrelay.Names{Name: c.slot}); err != nil {
			t.Fatal(err)
		}
	}
	return fx.StoreFixture(ob)
}

// inbox is the consumer's inbox and effects table on a fresh PostgreSQL
// database (sqlx), whose DSN a consumer process gets.
func (c *cell) inbox(t *testing.T) *outboxtest.InboxFixture {
	c.inboxDSN = testenv.PostgresDSN(t)
	if c.bouncer != nil {
		u, _ := url.Parse(c.inboxDSN)
		c.inboxDSN = c.bouncer.DSN(strings.TrimPrefix(u.Path, "/"))
	}
	db := testenv.OpenPostgresDSN(t, c.inboxDSN)
	be := fixtures.InboxBackend{Name: "Postgres", Dialect: "postgres", Open: func(testing.TB) *sql.DB { return db }}
	f, _, _ := be.NewSQLInbox(t, true)
	return f
}

// rabbitMQ publishes through c.broker; the consumer reads directly.
func (c *cell) rabbitMQ(t *testing.T) *outboxtest.BrokerFixture {
	u, _ := url.Parse(testenv.AMQPURL(t))
	c.broker = faultproxy.Start(t, u.Host)
	direct := u.String()
	c.consumerBroker, c.consumerGroup = direct, "faults-"+testenv.RandomSuffix()
	u.Host = c.broker.Addr()
	c.brokerURL = u.String()
	pub, err := amqpbroker.NewPublisher(amqpbroker.Options{URL: u.String(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	sub, err := amqpbroker.NewSubscriber(amqpbroker.SubscriberOptions{URL: direct, Consumer: "faults-" + testenv.RandomSuffix(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return &outboxtest.BrokerFixture{Publisher: pub, Subscriber: sub}
}

// sns publishes to the goaws emulator through c.broker, one Publish per
// event (goaws has no PublishBatch), creating the topics; in ordered mode
// every topic is a FIFO topic (fifo_only=true, event types ending in
// ".fifo"). The consumer reads the SQS queues directly.
func (c *cell) sns(t *testing.T) *outboxtest.BrokerFixture {
	g := sqstest.New(t)
	// A consumer killed while it held messages gets them back soon.
	g.VisibilityTimeout = 3
	c.goaws, c.consumerBroker = g, "sqs"
	u, err := url.Parse(g.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	c.broker = faultproxy.Start(t, u.Host)
	endpoint := "http://" + c.broker.Addr()
	q := url.Values{"region": {"us-east-1"}, "create_topics": {"true"}, "max_batch_size": {"1"}, "endpoint": {endpoint}}
	if c.ordering == "on" {
		q.Set("fifo_only", "true")
	}
	c.brokerURL = "sns://?" + q.Encode()
	// goaws checks no signature; the relay process finds these through
	// the standard AWS chain.
	c.env = []string{"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"}
	pub, err := snsbroker.NewPublisher(sqstest.NewSNSClient(t, endpoint), snsbroker.Options{CreateTopics: true, MaxBatchSize: 1,
		FIFOOnly: c.ordering == "on", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	sub := &sqstest.Subscriber{T: t, G: g, Raw: true}
	t.Cleanup(func() { sub.Close() })
	return &outboxtest.BrokerFixture{Publisher: pub, Subscriber: sub, Topic: snsbroker.TopicName}
}

// kafka runs an in-process Kafka-protocol cluster (kfake) behind c.broker:
// the cluster advertises the proxy's address, so every client, the
// relay's producer and the consumer, goes through it.
func (c *cell) kafka(t *testing.T) *outboxtest.BrokerFixture {
	// own is the cluster's own address: a restarted cluster listens there
	// again, behind the same proxy. Its port is below the ephemeral range
	// (testenv.FreePort), where no connection can take it meanwhile.
	var own string
	first := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	listen := func(network, address string) (net.Listener, error) {
		addr := own
		if addr == "" {
			addr = first
		}
		l, err := net.Listen(network, addr)
		if err != nil {
			return nil, err
		}
		if own == "" {
			p, err := faultproxy.New(l.Addr().String())
			if err != nil {
				l.Close()
				return nil, err
			}
			own, c.broker = l.Addr().String(), p
		}
		return advertised{Listener: l, addr: c.broker}, nil
	}
	c.kfakeOpts = []kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4),
		kfake.GroupMinSessionTimeout(time.Second), kfake.ListenFn(listen)}
	if c.kafkaRestart {
		// Durable, as a Kafka broker is: every produced batch is on disk
		// before it is acknowledged, and a restart reloads the logs and
		// the groups' offsets.
		c.kfakeOpts = append(c.kfakeOpts, kfake.DataDir(t.TempDir()), kfake.SyncWrites())
	}
	cl, err := kfake.NewCluster(c.kfakeOpts...)
	if err != nil {
		t.Fatal(err)
	}
	c.kfake = cl
	t.Cleanup(func() { c.kfake.Close(); c.broker.Close() })
	c.brokerURL = "kafka://" + strings.Join(cl.ListenAddrs(), ",")
	c.consumerBroker, c.consumerGroup = c.brokerURL, "faults-"+testenv.RandomSuffix()
	pub, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: cl.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	sub, err := kafkabroker.NewSubscriber(kafkabroker.SubscriberOptions{Brokers: cl.ListenAddrs(), ConsumerGroup: "faults-" + testenv.RandomSuffix(),
		Client: fixtures.KafkaGroupTimings(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return &outboxtest.BrokerFixture{Publisher: pub, Subscriber: sub}
}

// natsJS runs a nats-server of the cell's own, with JetStream on disk,
// behind c.broker: the relay publishes through the proxy, the consumer
// reads directly. Its stream holds the suite's subjects.
func (c *cell) natsJS(t *testing.T) *outboxtest.BrokerFixture {
	c.nats = testenv.StartNATS(t)
	u, _ := url.Parse(c.nats.URL())
	c.broker = faultproxy.Start(t, u.Host)
	const stream, subjects = "FAULTS", "suite.>"
	c.brokerURL = "nats://" + c.broker.Addr() + "?stream=" + stream + "&subjects=" + subjects + "&ack_timeout=2s"
	c.consumerBroker, c.consumerGroup = c.nats.URL()+"?stream="+stream, "faults-"+testenv.RandomSuffix()
	pub, err := natsbroker.NewPublisher(t.Context(), natsbroker.Options{URL: c.nats.URL(), Stream: stream, StreamSubjects: []string{subjects}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	sub, err := natsbroker.NewSubscriber(natsbroker.SubscriberOptions{URL: c.nats.URL(), Stream: stream, Consumer: "faults-" + testenv.RandomSuffix(),
		AckWait: 3 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return &outboxtest.BrokerFixture{Publisher: pub, Subscriber: sub}
}

// stopBroker and startBroker are the restart fault's: the cell's
// nats-server (SIGTERM, then a start on the storage it kept), or the
// in-process Kafka cluster (closed, then started from its files).
func (c *cell) stopBroker(t *testing.T) {
	if c.nats != nil {
		c.nats.Stop(t)
		return
	}
	c.kfake.Close()
}

func (c *cell) startBroker(t *testing.T) {
	if c.nats != nil {
		c.nats.Start(t)
		return
	}
	c.startKafka(t)
}

// newBroker is the broker fixture of kind: RabbitMQ, Kafka, SNS or NATS.
func (c *cell) newBroker(kind string) outboxtest.NewBrokerFunc {
	switch kind {
	case "Kafka":
		return c.kafka
	case "SNS":
		return c.sns
	case "NATS":
		return c.natsJS
	}
	return c.rabbitMQ
}

// advertised is a listener that reports the proxy's address, so that the
// cluster hands that address to its clients.
type advertised struct {
	net.Listener
	addr *faultproxy.Proxy
}

func (a advertised) Addr() net.Addr {
	ta, err := net.ResolveTCPAddr("tcp", a.addr.Addr())
	if err != nil {
		return a.Listener.Addr()
	}
	return ta
}

// faultCase is a fault of the matrix. Every cell runs the relay as a
// process of the CLI (txoutbox relay), whose /healthz, /metrics and log
// the cell checks.
type faultCase struct {
	outboxtest.Fault
	crash bool // the outbox is on a server of its own, which the fault crashes
	// consumer: the consumer runs as a process, which the fault kills.
	consumer bool
	// kafkaRestart: the fault stops the broker and starts it again from
	// its files: the in-process Kafka cluster, or the cell's nats-server.
	kafkaRestart bool
	// binlog: the fault is the binlog's: only MariaDB log mode's rows run
	// it.
	binlog bool
	// pooler: the fault is the PgBouncer's: only its row runs it.
	pooler bool
	// brokerSide: the fault is the broker's alone, so the quick form runs
	// it once per broker (with the outbox on PostgreSQL), not again with
	// the outbox on MariaDB.
	brokerSide bool
	// slowBroker: the broker is slow, not failing (latency, bandwidth).
	slowBroker bool
	// storeSide: the fault is the database's or the relay process's, and
	// which broker the relay publishes to does not change it, so the quick
	// form runs it with one broker per row kind and mode, a different one
	// for each fault (every broker meets every such fault and backend).
	storeSide bool
	// signals is what the relay must report while the fault lasts:
	// "broker" (txoutbox_broker_up 0, one down and one back log line),
	// "store" (/healthz 503, txoutbox_store_up 0, one down and one back
	// line), "healthz" (/healthz 503: a blackholed database holds the
	// relay's queries rather than failing them), or "" (nothing to see).
	signals string
}

// faults are the faults of the matrix, injected on the cell's proxies,
// pools and processes.
func faults(c *cell) []faultCase {
	d := 2 * time.Second
	if long {
		d = 30 * time.Second
	}
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	heal := func(p func() *faultproxy.Proxy) func(t *testing.T) {
		return func(t *testing.T) { must(t, p().Heal()) }
	}
	db := func() *faultproxy.Proxy { return c.db }
	broker := func() *faultproxy.Proxy { return c.broker }
	fault := func(name, signals string, inject func(t *testing.T), heal func(t *testing.T)) faultCase {
		return faultCase{Fault: outboxtest.Fault{Name: name, Duration: d, Inject: inject, Heal: heal}, signals: signals}
	}
	crashName := "PostgreSQL crash (immediate stop, start)"
	if c.backend == backendMariaDB || c.backend == backendBinlog {
		crashName = "MariaDB crash (SIGKILL, start)"
	}
	crash := fault(crashName, "store",
		func(t *testing.T) { crashMu.Lock(); c.server.Crash(t) },
		func(t *testing.T) { defer crashMu.Unlock(); c.server.Start(t) })
	crash.crash = true
	consumer := fault("consumer SIGKILL (inbox)", "", c.killConsumer, c.restartConsumer)
	consumer.consumer = true
	restart := fault("broker stopped and started", "broker", c.stopBroker, c.startBroker)
	restart.kafkaRestart, restart.brokerSide = true, true
	crash.storeSide = true
	// The binlog rotated, and the files before the new one purged, on a
	// server of the cell's own (a purge would take other tests' files).
	purge := fault("binlog rotated and purged (FLUSH BINARY LOGS, PURGE BINARY LOGS)", "", c.rotateAndPurge, func(*testing.T) {})
	purge.crash, purge.binlog, purge.storeSide = true, true, true
	// PgBouncer shut down at once (SIGTERM closes its clients'
	// connections) and started again: producers, relay and consumer lose
	// their connections to the database together.
	pooler := fault("PgBouncer restarted (SIGTERM, start)", "store", func(t *testing.T) { c.bouncer.Stop(t) }, func(t *testing.T) { c.bouncer.Start(t) })
	pooler.pooler = true
	brokerSide := func(f faultCase) faultCase { f.brokerSide = true; return f }
	slow := func(f faultCase) faultCase { f.slowBroker = true; return brokerSide(f) }
	storeSide := func(f faultCase) faultCase { f.storeSide = true; return f }
	return []faultCase{
		slow(fault("broker latency 200ms", "", func(t *testing.T) { must(t, c.broker.Latency(200*time.Millisecond)) }, heal(broker))),
		slow(fault("broker bandwidth 8 KB/s", "", func(t *testing.T) { must(t, c.broker.Bandwidth(8)) }, heal(broker))),
		fault("broker connections reset", "broker", func(t *testing.T) { must(t, c.broker.Reset()) }, heal(broker)),
		brokerSide(fault("broker blackholed", "broker", func(t *testing.T) { must(t, c.broker.Blackhole()) }, heal(broker))),
		brokerSide(fault("broker refuses connections", "broker", func(t *testing.T) { c.broker.Refuse() }, heal(broker))),
		storeSide(fault("database blackholed (relay)", "healthz", func(t *testing.T) { must(t, c.db.Blackhole()) }, heal(db))),
		storeSide(fault("database connections reset (relay)", "store", func(t *testing.T) { must(t, c.db.Reset()) }, heal(db))),
		storeSide(fault("producers' pool exhausted", "", c.exhaustProducers, c.releaseProducers)),
		storeSide(fault("relay SIGKILL", "", c.killRelay, c.startRelay)),
		consumer,
		restart,
		crash,
		purge,
		pooler,
	}
}

// rotateAndPurge switches the server to a new binlog file and purges the
// files before it, as expire_logs_days would, while the stream reads.
func (c *cell) rotateAndPurge(t *testing.T) {
	db, err := sql.Open("mysql", c.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(t.Context(), "FLUSH BINARY LOGS"); err != nil {
		t.Fatal(err)
	}
	var file string
	var pos int64
	var a, b any
	if err := db.QueryRowContext(t.Context(), "SHOW MASTER STATUS").Scan(&file, &pos, &a, &b); err != nil {
		t.Fatal(err)
	}
	// The server keeps a file until InnoDB's checkpoint of it is
	// written: purge until the oldest is the new one.
	// The server's own pace: a cell whose purge lags still runs.
	_ = wait.Poll(t.Context(), "the binlog files before "+file+" purged", func() (bool, any) {
		if _, err := db.ExecContext(t.Context(), "PURGE BINARY LOGS TO '"+file+"'"); err != nil {
			t.Fatal(err)
		}
		var first string
		var size int64
		if err := db.QueryRowContext(t.Context(), "SHOW BINARY LOGS").Scan(&first, &size); err != nil {
			t.Fatal(err)
		}
		return first == file, first
	})
}

// exhaustProducers takes every connection of the producers' pool, each in
// a transaction, so that producers wait for one.
func (c *cell) exhaustProducers(t *testing.T) {
	for range 4 {
		conn, err := c.producers.Conn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(t.Context(), "BEGIN"); err != nil {
			t.Fatal(err)
		}
		c.held = append(c.held, conn)
	}
}

func (c *cell) releaseProducers(t *testing.T) {
	for _, conn := range c.held {
		_, _ = conn.ExecContext(t.Context(), "ROLLBACK")
		conn.Close()
	}
	c.held = nil
}

// startRelay starts a relay process (txoutbox relay) on the cell's outbox
// and broker; the test's end stops it.
func (c *cell) startRelay(t *testing.T) {
	if c.httpAddr == "" {
		// A relay started again after a kill binds the same address.
		c.httpAddr = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	}
	// A race-built relay polling every 50 ms used 0.45 s of CPU per idle
	// 10 s, at 200 ms 0.13 s (1 s: 0.05 s), and the database answers each
	// poll too: 200 ms keeps recovery within the checks' bounds at a
	// few per cent of the matrix's CPU less than 50 ms did.
	cmd := exec.Command(cli.build(t), "relay", "--dsn", c.relayDSN, "--broker", c.brokerURL, "--ordering", c.ordering,
		"--http-addr", c.httpAddr, "--poll-interval", "200ms", "--publish-timeout", "2s", "--initial-backoff", "100ms",
		"--max-backoff", "1s", "--max-attempts", "1000", "--batch-size", "25", "--concurrency", "2", "--stats-interval", "500ms")
	switch c.backend {
	case backendLog:
		cmd.Args = append(cmd.Args, "--mode", "log", "--slot", c.slot, "--publication", c.slot)
	case backendBinlog:
		cmd.Args = append(cmd.Args, "--mode", "log", "--stream", c.slot)
	}
	cmd.Env = append(append(os.Environ(), "TXOUTBOX_DSN=", "TXOUTBOX_BROKER="), c.env...)
	out := &logbuf.Buffer{}
	c.relayLog = out
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := c.relay == nil
	c.relay = cmd
	// A fault must not meet a process that is still starting, which on a
	// loaded machine takes seconds: the cell's first relay is ready when
	// /healthz answers 200 (it answers 503 while it waits for the
	// database and the broker). A relay started again after a kill is
	// ready when /healthz answers at all: a fault may still be on.
	if err := wait.Poll(t.Context(), "the relay process to be ready (/healthz)", func() (bool, any) {
		code, _ := c.get("/healthz")
		return code == http.StatusOK || code != 0 && !first, code
	}); err != nil && t.Context().Err() == nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("relay process output:\n%s", out)
		}
	})
}

func (c *cell) killRelay(t *testing.T) {
	if err := c.relay.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.relay.Wait()
}

// startConsumer starts the consumer process (faultconsumer) and returns
// once it is subscribed; the test's end stops it.
func (c *cell) startConsumer(t *testing.T, topic, consumer string, delivered func(eventID string)) {
	c.consumerTopic, c.consumerName, c.delivered = topic, consumer, delivered
	if c.goaws != nil {
		// The queue outlives the consumer processes: each reads it.
		_, queueURL := c.goaws.SubscribeQueue(t, t.Context(), topic, true)
		c.consumerEnv = []string{"FC_SQS_ENDPOINT=" + c.goaws.Endpoint, "FC_SQS_QUEUE=" + queueURL}
	}
	c.restartConsumer(t)
}

func (c *cell) restartConsumer(t *testing.T) {
	cmd := exec.Command(faultConsumer.build(t))
	cmd.Env = append(os.Environ(), "FC_DSN="+c.inboxDSN, "FC_BROKER="+c.consumerBroker, "FC_GROUP="+c.consumerGroup,
		"FC_CONSUMER="+c.consumerName, "FC_TOPIC="+c.consumerTopic)
	cmd.Env = append(cmd.Env, c.consumerEnv...)
	stderr := &logbuf.Buffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		r := bufio.NewReader(stdout)
		for {
			// A killed process may leave half a line: only whole lines
			// count.
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(line, "\n")
			if id, ok := strings.CutPrefix(line, "delivered "); ok {
				c.delivered(id)
			} else if line == "ready" {
				close(ready)
			}
		}
	}()
	c.consumer, c.consumerDone = cmd, done
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("consumer process output:\n%s", stderr)
		}
	})
	select {
	case <-ready:
	case <-done:
		_ = cmd.Wait()
		t.Fatalf("the consumer process exited before it subscribed:\n%s", stderr)
	case <-time.After(wait.Stall):
		t.Fatalf("the consumer process did not subscribe in %v:\n%s", wait.Stall, stderr)
	}
}

// startKafka starts the in-process Kafka cluster again, from its files,
// on the address it had.
func (c *cell) startKafka(t *testing.T) {
	cl, err := kfake.NewCluster(c.kfakeOpts...)
	if err != nil {
		t.Fatal(err)
	}
	c.kfake = cl
}

func (c *cell) killConsumer(t *testing.T) {
	if err := c.consumer.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-c.consumerDone
	_ = c.consumer.Wait()
}

// program is a command the tests build once per run, with the race
// detector, as the test binaries: the build then shares make test's
// compiled packages, and the relay's races are found too. The consumer
// was once built without it, which compiled every dependency a second
// time: over 200 s of a clean run's saturated CPU, while the two cells
// waiting for it (consumer SIGKILL) held both of the matrix's parallel
// slots.
type program struct {
	pkg  string
	once sync.Once
	path string
	err  error
}

var (
	cli           = &program{pkg: "github.com/txoutbox/txoutbox/cmd/txoutbox"}
	faultConsumer = &program{pkg: "github.com/txoutbox/txoutbox/internal/testkit/faultmatrix/internal/faultconsumer"}
)

// TestMain removes the programs the tests built: each run builds them into
// a directory of its own (60 MB), which nothing else would remove.
func TestMain(m *testing.M) {
	code := m.Run()
	for _, p := range []*program{cli, faultConsumer} {
		if p.path != "" {
			os.RemoveAll(filepath.Dir(p.path))
		}
	}
	os.Exit(code)
}

// build builds the program on its first call and returns its path.
func (p *program) build(t *testing.T) string {
	p.once.Do(func() {
		dir, err := os.MkdirTemp("", "txoutbox-faults")
		if err != nil {
			p.err = err
			return
		}
		p.path = filepath.Join(dir, filepath.Base(p.pkg))
		if out, err := exec.Command("go", "build", "-race", "-ldflags=-s -w", "-o", p.path, p.pkg).CombinedOutput(); err != nil {
			p.err = fmt.Errorf("go build %s: %v\n%s", p.pkg, err, out)
		}
	})
	if p.err != nil {
		t.Fatal(p.err)
	}
	return p.path
}

var (
	reportMu sync.Mutex
	reports  = map[string][]outboxtest.FaultReport{}
)

// TestFaultMatrix runs every fault against every broker, unordered and
// ordered, while producers write: nothing is lost, nothing takes effect
// twice, no aggregate is reordered. The quick form (make test) holds each
// fault 2 s and runs a cover of the cells: every fault on every backend,
// every failing broker with every broker fault, each slow broker fault
// once, the brokers and ordering modes rotating over the rest
// (docs/reliability.md). The long form (make test-long,
// TXOUTBOX_FAULTS=long) runs every cell and holds each fault 30 s with
// more events. The table goes to the log (-v).
func TestFaultMatrix(t *testing.T) {
	tier.SkipShort(t)
	t.Parallel()
	// The rows: every broker with the outbox on PostgreSQL, on MariaDB,
	// and in log mode.
	type broker struct {
		name    string
		kind    string // RabbitMQ, Kafka or SNS
		backend backend
	}
	var brokers []broker
	for _, be := range []backend{backendPostgres, backendMariaDB, backendLog, backendBinlog} {
		for _, kind := range []string{"RabbitMQ", "Kafka", "SNS"} {
			name := kind + map[backend]string{backendMariaDB: ", outbox on MariaDB", backendLog: ", log mode", backendBinlog: ", MariaDB log mode"}[be]
			brokers = append(brokers, broker{name: name, kind: kind, backend: be})
		}
	}
	// NATS JetStream with the outbox on PostgreSQL: the broker's faults,
	// its server stopped and started, the relay's and the consumer's
	// SIGKILL (the database's faults do not change with the broker).
	brokers = append(brokers, broker{name: "NATS JetStream", kind: "NATS", backend: backendPostgres})
	// PostgreSQL behind PgBouncer: the pooler's restart.
	brokers = append(brokers, broker{name: "RabbitMQ, through PgBouncer", kind: "RabbitMQ", backend: backendPgBouncer})
	base := outboxtest.FaultOptions{}
	if long {
		base.Rate, base.Before, base.After = 400, 5*time.Second, 5*time.Second
	}
	for bi, b := range brokers {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for mi, mode := range []core.OrderingMode{core.OrderingOff, core.OrderingOn} {
				names := faults(&cell{backend: b.backend})
				for i := range names {
					if (b.backend == backendPgBouncer) != names[i].pooler {
						continue
					}
					if b.kind == "NATS" {
						if !natsFault(names[i]) || !long && (mi+i)%2 != 0 {
							continue
						}
					} else if b.backend == backendPgBouncer {
						// Both modes.
					} else if !long && names[i].storeSide && (bi%3 != (int(b.backend)+mi+i)%3 || (int(b.backend)+mi+i)%2 != 0) {
						// One broker of three, and one ordering mode of two,
						// for a fault the broker does not change (see
						// faultCase.storeSide): the broker and the mode
						// rotate with the fault and the backend.
						continue
					}
					if names[i].consumer && b.kind == "SNS" {
						// Unordered only: goaws v0.4.5 emulates SQS FIFO
						// too loosely to check order across a consumer's
						// death. Its SNS-to-SQS delivery drops
						// MessageGroupId (one group for all), a receive
						// hides every message it looks at while the group
						// is locked, and any of those hidden messages
						// unlocks the group when its visibility timeout
						// ends, while the dead consumer's message is still
						// on its way back: the next consumer then gets
						// later messages first (141 of 150 reordered in
						// one make test run). Real SQS FIFO holds a group
						// until its in-flight message is deleted or
						// visible again.
						if mode == core.OrderingOn {
							continue
						}
					} else if b.kind != "NATS" && b.backend != backendPgBouncer && !long && !names[i].storeSide && (bi+mi+i)%2 != 0 {
						// Every broker meets the fault in one of the two
						// modes, and each mode meets it with a broker:
						// every pair of the cell's dimensions is run.
						continue
					}
					name := names[i].Name
					if b.backend == backendLog && names[i].crash {
						// TestOutageChaosLog (package ordered) crashes
						// log mode's server.
						continue
					}
					if names[i].kafkaRestart && b.kind != "Kafka" && b.kind != "NATS" {
						// RabbitMQ's restart is TestOutageFaultMatrix's;
						// goaws keeps no state across one.
						continue
					}
					if names[i].binlog && b.backend != backendBinlog {
						continue
					}
					if !long && b.backend == backendLog && names[i].brokerSide && names[i].slowBroker {
						// A slow broker holds log mode's publishes as it
						// holds table mode's; log mode meets the broker's
						// failures (reset, blackhole, refusal, restart).
						continue
					}
					if !long && (b.backend == backendMariaDB || b.backend == backendBinlog) && names[i].brokerSide {
						// The relay on MariaDB meets a broker fault as on
						// PostgreSQL (one reset cell stays); the long form
						// runs them all.
						continue
					}
					if !long && names[i].slowBroker && b.kind != map[string]string{"broker latency 200ms": "RabbitMQ", "broker bandwidth 8 KB/s": "Kafka"}[names[i].Name] {
						// A slow broker is not a failing one: nothing is
						// refused, lost or sent again, the relay waits. The
						// quick form runs each slow fault with one broker.
						continue
					}
					if !long && b.kind == "NATS" && !names[i].kafkaRestart && !names[i].consumer && names[i].Name != "relay SIGKILL" && names[i].Name != "broker connections reset" {
						// NATS meets what is its own (its server stopped
						// and started on its JetStream files, the relay's
						// and the consumer's SIGKILL, Nats-Msg-Id's
						// dedup across a reset); the other brokers meet
						// the blackhole and the refusal.
						continue
					}
					if !long && b.backend == backendLog && names[i].brokerSide && !names[i].kafkaRestart && b.kind != []string{"RabbitMQ", "Kafka", "SNS"}[i%3] {
						// Log mode meets each failing broker once, the
						// broker rotating with the fault.
						continue
					}
					if names[i].consumer && b.backend != backendPostgres {
						// The consumer's side does not change with where
						// the outbox is or how it is relayed.
						continue
					}
					ordered := map[core.OrderingMode]string{core.OrderingOff: "unordered", core.OrderingOn: "ordered"}[mode]
					opts := base
					if b.kind == "SNS" {
						// goaws takes one Publish at a time, slowly: half
						// the rate (RunFault's default is 100).
						opts.Rate = max(base.Rate, 100) / 2
						if mode == core.OrderingOn {
							opts.EventTypeSuffix = ".fifo"
						}
					}
					t.Run(ordered+"/"+strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
						runCell(t, b.name, func(c *cell) outboxtest.NewBrokerFunc { return c.newBroker(b.kind) }, b.backend, mode, opts,
							func(c *cell) faultCase { return faults(c)[i] })
					})
				}
			}
		})
	}
	t.Cleanup(func() {
		for _, b := range brokers {
			t.Logf("%s\n%s\n%s", b.name, outboxtest.FaultTableHeader, joinReports(reports[b.name]))
		}
	})
}

// natsFault reports whether the NATS row runs f: the broker's own faults
// and the processes' kills.
func natsFault(f faultCase) bool {
	if f.consumer || f.kafkaRestart || f.Name == "relay SIGKILL" {
		return true
	}
	return !f.storeSide && !f.crash && !f.binlog
}

// runCell runs one cell: a fresh outbox, broker and inbox, the relay
// process, the fault of pick, and the checks of what the relay reports.
func runCell(t *testing.T, name string, newBroker func(c *cell) outboxtest.NewBrokerFunc, be backend, mode core.OrderingMode,
	opts outboxtest.FaultOptions, pick func(c *cell) faultCase) outboxtest.FaultReport {
	c := &cell{ordering: map[core.OrderingMode]string{core.OrderingOff: "off", core.OrderingOn: "on"}[mode], backend: be}
	fc := pick(c)
	o := opts
	o.Ordering = mode
	o.StartRelay = c.startRelay
	if fc.crash {
		if be == backendMariaDB || be == backendBinlog {
			c.server = testenv.StartMariaDB(t)
		} else {
			c.server = testenv.StartCluster(t)
		}
		o.ProducersMayFail = true
	}
	if fc.consumer {
		o.StartConsumer = c.startConsumer
	}
	if fc.pooler {
		// The producers' connections go through the pooler too.
		o.ProducersMayFail = true
	}
	c.kafkaRestart = fc.kafkaRestart
	fault := fc.Fault
	if fc.signals != "" {
		inject := fault.Inject
		fault.Inject = func(t *testing.T) {
			if c.relayLog != nil {
				c.logAtInject = len(c.relayLog.String())
			}
			inject(t)
		}
		// Before the fault is healed, the relay must say so.
		heal := fault.Heal
		fault.Heal = func(t *testing.T) { c.checkDuring(t, fc.signals); heal(t) }
	}
	rep := outboxtest.RunFault(t, c.store, newBroker(c), c.inbox, fault, o)
	c.checkAfter(t, fc.signals)
	reportMu.Lock()
	reports[name] = append(reports[name], rep)
	reportMu.Unlock()
	return rep
}

// TestOutageFaultMatrix is the matrix's cell that stops the RabbitMQ
// server itself (rabbitmqctl stop_app, then start_app): it takes down the
// broker every test shares, so it runs with the outage tests, one package
// at a time (see scripts/test.sh).
func TestOutageFaultMatrix(t *testing.T) {
	tier.SkipShort(t)
	d := 2 * time.Second
	if long {
		d = 30 * time.Second
	}
	var rows []string
	for _, mode := range []core.OrderingMode{core.OrderingOff, core.OrderingOn} {
		t.Run(map[core.OrderingMode]string{core.OrderingOff: "unordered", core.OrderingOn: "ordered"}[mode], func(t *testing.T) {
			rep := runCell(t, "RabbitMQ stopped", func(c *cell) outboxtest.NewBrokerFunc { return c.rabbitMQ }, backendPostgres, mode, outboxtest.FaultOptions{},
				func(c *cell) faultCase {
					return faultCase{Fault: outboxtest.Fault{Name: "broker stopped and started", Duration: d,
						Inject: func(t *testing.T) { testenv.RabbitMQCtl(t, "stop_app") },
						Heal: func(t *testing.T) {
							testenv.RabbitMQCtl(t, "start_app")
							testenv.RabbitMQCtl(t, "await_startup")
						}}, signals: "broker"}
				})
			rows = append(rows, rep.String())
		})
	}
	t.Logf("\n%s\n%s", outboxtest.FaultTableHeader, strings.Join(rows, "\n"))
}

func joinReports(rs []outboxtest.FaultReport) string {
	lines := make([]string, len(rs))
	for i, r := range rs {
		lines[i] = r.String()
	}
	return strings.Join(lines, "\n")
}

// get returns the status and body of the relay's path.
func (c *cell) get(path string) (int, string) {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + c.httpAddr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (c *cell) gauge(name string) string {
	_, body := c.get("/metrics")
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return "absent"
	}
	return m[1]
}

// checkDuring waits until the relay reports the fault, which holds until
// then: it fails only when the relay's report stands still for wait.Stall.
func (c *cell) checkDuring(t *testing.T, signals string) {
	t.Helper()
	var last string
	err := wait.Poll(t.Context(), "the relay to report the fault", func() (bool, any) {
		var ok bool
		var state string
		code, _ := c.get("/healthz")
		switch signals {
		case "broker":
			// Down now, or said so since the fault began: a relay whose
			// publishes fail fast between re-dials may be between two
			// failed batches when this looks.
			state = "txoutbox_broker_up " + c.gauge("txoutbox_broker_up")
			ok = state == "txoutbox_broker_up 0" || (c.relayLog != nil && strings.Contains(c.relayLog.String()[c.logAtInject:], brokerDownLine))
		case "store":
			// /healthz pings the database itself; txoutbox_store_up is
			// the batch path's view, which an ordered relay whose
			// partitions are not leased yet does not exercise.
			state = fmt.Sprintf("/healthz %d, txoutbox_store_up %s", code, c.gauge("txoutbox_store_up"))
			ok = code == http.StatusServiceUnavailable
		case "healthz":
			state = fmt.Sprintf("/healthz %d", code)
			ok = code == http.StatusServiceUnavailable
		}
		last = state
		return ok, state
	})
	if err != nil && t.Context().Err() == nil {
		t.Errorf("during the fault the relay reported %s: %v", last, err)
	}
}

// Log lines of the relay that announce a dependency's state.
const (
	brokerDownLine = "the broker took no event of the batch"
	brokerBackLine = "the broker takes events again"
	storeDownLine  = "relay batch failed; retrying with backoff"
	storeBackLine  = "relay batches succeed again"
	streamLostLine = "log: stream lost; reconnecting"
	streamBackLine = "log: streaming again"
	// The process's other components that meet a database fault: the stats
	// monitor and /healthz's ping. Their lines announce it too; their back
	// lines come with their next check, so they are not paired.
	monitorDownLine = "monitor check failed"
	healthzDownLine = "/healthz: the database does not answer"
	// A relay that starts while its database does not answer waits for
	// it, and says so.
	startDownLine = "database does not answer; retrying with backoff"
	startBackLine = "database answers; starting"
)

// checkAfter checks that the relay reports health again, and that it
// logged the fault's start and end once each, not once per failure.
func (c *cell) checkAfter(t *testing.T, signals string) {
	t.Helper()
	if c.httpAddr == "" || c.relayLog == nil {
		return
	}
	var state string
	err := wait.Poll(t.Context(), "the relay to report itself healthy after the fault", func() (bool, any) {
		code, _ := c.get("/healthz")
		b, s := c.gauge("txoutbox_broker_up"), c.gauge("txoutbox_store_up")
		state = fmt.Sprintf("/healthz %d, txoutbox_broker_up %s, txoutbox_store_up %s", code, b, s)
		return code == http.StatusOK && b == "1" && s == "1", state
	})
	if err != nil && t.Context().Err() == nil {
		t.Errorf("after the fault: %s; want 200, 1, 1 (%v)", state, err)
	}
	// The relay announces the broker back once it has taken events for
	// two seconds (a flapping broker is one outage): wait for the line.
	var errs []string
	_ = wait.Poll(t.Context(), "the relay's announcements", func() (bool, any) {
		errs = announcementErrors(c.relayLog.String(), signals, c.backend)
		return len(errs) == 0, len(c.relayLog.String())
	})
	for _, e := range errs {
		t.Error(e)
	}
}

// announcements are the relay's down lines that may announce a fault of
// signals. A database fault meets whichever component touches the
// database first: in table mode the batch path; in log mode the stream
// (its replication connection) or the table relay beside it, if it ran a
// batch during the fault, which depends on timing; in ordered mode a relay
// whose partitions are not leased yet runs no batch, and the stats monitor
// or /healthz's ping meets it. Any one suffices; none is a failure.
func announcements(signals string, be backend) []string {
	switch {
	case signals == "broker":
		return []string{brokerDownLine}
	case signals == "store" && (be == backendLog || be == backendBinlog):
		return []string{storeDownLine, streamLostLine, monitorDownLine, healthzDownLine, startDownLine}
	case signals == "store":
		return []string{storeDownLine, monitorDownLine, healthzDownLine, startDownLine}
	}
	return nil
}

// announcementErrors checks a relay's output: every down line has its back
// line, the fault of signals was announced by one of its lines, and no
// state was logged per failure.
func announcementErrors(out, signals string, be backend) []string {
	var errs []string
	want := announcements(signals, be)
	announced := 0
	for _, pair := range [][2]string{{brokerDownLine, brokerBackLine}, {storeDownLine, storeBackLine}, {streamLostLine, streamBackLine}, {startDownLine, startBackLine}} {
		down, back := strings.Count(out, pair[0]), strings.Count(out, pair[1])
		if slices.Contains(want, pair[0]) {
			announced += down
		}
		switch {
		case down != back:
			errs = append(errs, fmt.Sprintf("the relay logged %q %d times and %q %d times: a state left unannounced", pair[0], down, pair[1], back))
		case down > 6 && !long:
			// A slow or flapping broker (latency, bandwidth, Kafka's
			// circuit breaker after resets) lets some batches through:
			// the state does change back and forth a few times. Logging
			// per failure would be dozens of lines.
			errs = append(errs, fmt.Sprintf("the relay logged %q %d times during one fault: per failure, not per change of state", pair[0], down))
		}
	}
	for _, line := range []string{monitorDownLine, healthzDownLine} {
		if slices.Contains(want, line) {
			announced += strings.Count(out, line)
		}
	}
	if len(want) > 0 && announced == 0 {
		errs = append(errs, fmt.Sprintf("the relay never logged %s", strings.Join(quoteAll(want), " or ")))
	}
	return errs
}

func quoteAll(ss []string) []string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return q
}
