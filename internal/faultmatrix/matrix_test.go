package faultmatrix_test

import (
	"database/sql"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/fixtures"
	"github.com/txoutbox/txoutbox/internal/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
	"github.com/txoutbox/txoutbox/testing/faultproxy"
	"github.com/txoutbox/txoutbox/testing/sqlfixture"
)

var quiet = slog.New(slog.DiscardHandler)

// long is the full matrix: longer faults, more events (TXOUTBOX_FAULTS=long).
var long = os.Getenv("TXOUTBOX_FAULTS") == "long"

// cell is what one run of the matrix needs: the proxies in front of the
// relay's database and of the broker.
type cell struct {
	db, broker *faultproxy.Proxy
}

// store makes a fresh PostgreSQL outbox whose producers write directly and
// whose relay reads through c.db.
func (c *cell) store(t *testing.T) *outboxtest.StoreFixture {
	dsn := testenv.PostgresDSN(t)
	direct, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	fx := sqlfixture.New(t, direct, dialect.Postgres, sqlfixture.Options{SkipInbox: true})
	u, _ := url.Parse(dsn)
	c.db = faultproxy.Start(t, u.Host)
	u.Host = c.db.Addr()
	// Connections that wait for a blackholed server give up; the pool
	// dials again once it is back.
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	proxied, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxied.Close() })
	ob, err := sqlxoutbox.NewDB(proxied, sqlxoutbox.Options{Dialect: dialect.Postgres, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return fx.StoreFixture(ob)
}

func (c *cell) inbox(t *testing.T) *outboxtest.InboxFixture {
	f, _, _ := fixtures.InboxBackends[0].NewSQLInbox(t, true) // PostgreSQL, sqlx
	return f
}

// rabbitMQ publishes through c.broker; the consumer reads directly.
func (c *cell) rabbitMQ(t *testing.T) *outboxtest.BrokerFixture {
	u, _ := url.Parse(testenv.AMQPURL(t))
	c.broker = faultproxy.Start(t, u.Host)
	direct := u.String()
	u.Host = c.broker.Addr()
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

// kafka runs an in-process Kafka-protocol cluster (kfake) behind c.broker:
// the cluster advertises the proxy's address, so every client, the
// relay's producer and the consumer, goes through it.
func (c *cell) kafka(t *testing.T) *outboxtest.BrokerFixture {
	var once sync.Once
	var setupErr error
	listen := func(network, address string) (net.Listener, error) {
		l, err := net.Listen(network, "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		once.Do(func() {
			p, err := faultproxy.New(l.Addr().String())
			if err != nil {
				setupErr = err
				return
			}
			c.broker = p
		})
		if setupErr != nil {
			l.Close()
			return nil, setupErr
		}
		return advertised{Listener: l, addr: c.broker}, nil
	}
	cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4),
		kfake.GroupMinSessionTimeout(time.Second), kfake.ListenFn(listen))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close(); c.broker.Close() })
	pub, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: cl.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	cfg := kafkabroker.NewSaramaConfig()
	cfg.Consumer.Group.Session.Timeout = 2 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	sub, err := kafkabroker.NewSubscriber(kafkabroker.SubscriberOptions{Brokers: cl.ListenAddrs(), ConsumerGroup: "faults-" + testenv.RandomSuffix(),
		Sarama: cfg, ReconnectRetrySleep: 200 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return &outboxtest.BrokerFixture{Publisher: pub, Subscriber: sub}
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

// faults are the faults of the matrix; each is injected on the cell's
// proxies.
func faults(c *cell) []outboxtest.Fault {
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
	return []outboxtest.Fault{
		{Name: "broker latency 200ms", Duration: d, Inject: func(t *testing.T) { must(t, c.broker.Latency(200*time.Millisecond)) }, Heal: heal(broker)},
		{Name: "broker bandwidth 8 KB/s", Duration: d, Inject: func(t *testing.T) { must(t, c.broker.Bandwidth(8)) }, Heal: heal(broker)},
		{Name: "broker connections reset", Duration: d, Inject: func(t *testing.T) { must(t, c.broker.Reset()) }, Heal: heal(broker)},
		{Name: "broker blackholed", Duration: d, Inject: func(t *testing.T) { must(t, c.broker.Blackhole()) }, Heal: heal(broker)},
		{Name: "broker refuses connections", Duration: d, Inject: func(t *testing.T) { c.broker.Refuse() }, Heal: heal(broker)},
		{Name: "database blackholed (relay)", Duration: d, Inject: func(t *testing.T) { must(t, c.db.Blackhole()) }, Heal: heal(db)},
		{Name: "database connections reset (relay)", Duration: d, Inject: func(t *testing.T) { must(t, c.db.Reset()) }, Heal: heal(db)},
	}
}

var (
	reportMu sync.Mutex
	reports  = map[string][]outboxtest.FaultReport{}
)

// TestFaultMatrix runs every fault against RabbitMQ and Kafka, unordered
// and ordered, while producers write: nothing is lost, nothing takes
// effect twice, no aggregate is reordered. The quick form (make test)
// holds each fault 2s; TXOUTBOX_FAULTS=long holds each 30s with more
// events. The table goes to the log (-v).
func TestFaultMatrix(t *testing.T) {
	t.Parallel()
	type broker struct {
		name string
		new  func(c *cell) outboxtest.NewBrokerFunc
	}
	brokers := []broker{
		{"RabbitMQ", func(c *cell) outboxtest.NewBrokerFunc { return c.rabbitMQ }},
		{"Kafka", func(c *cell) outboxtest.NewBrokerFunc { return c.kafka }},
	}
	opts := outboxtest.FaultOptions{}
	if long {
		opts.Rate, opts.Before, opts.After = 400, 5*time.Second, 5*time.Second
	}
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, mode := range []core.OrderingMode{core.OrderingOff, core.OrderingOn} {
				names := faults(&cell{})
				for i := range names {
					name := names[i].Name
					ordered := map[core.OrderingMode]string{core.OrderingOff: "unordered", core.OrderingOn: "ordered"}[mode]
					t.Run(ordered+"/"+strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
						c := &cell{}
						fault := faults(c)[i]
						o := opts
						o.Ordering = mode
						rep := outboxtest.RunFault(t, c.store, b.new(c), c.inbox, fault, o)
						reportMu.Lock()
						reports[b.name] = append(reports[b.name], rep)
						reportMu.Unlock()
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

func joinReports(rs []outboxtest.FaultReport) string {
	lines := make([]string, len(rs))
	for i, r := range rs {
		lines[i] = r.String()
	}
	return strings.Join(lines, "\n")
}
