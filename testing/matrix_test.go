package outboxtest_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kfake"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	natsbroker "github.com/txoutbox/txoutbox/brokers/nats"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/inbox/sqlinbox"
	"github.com/txoutbox/txoutbox/internal/testkit/fixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/gormfixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	"github.com/txoutbox/txoutbox/internal/testkit/tier"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// TestMatrix runs the exactly-once suite over the stores × brokers × inboxes
// this repository ships, on PostgreSQL, MariaDB and SQLite (SNS runs the end-to-end suites in brokers/sns,
// whose SQS reader lives in its tests): a producer on the store, the real
// relay through a faulty, duplicating publisher, the broker, and two
// consumers of one group deduplicating through the inbox.
//
// make test runs every pair: each store with each inbox (35 cells), the
// broker chosen so that each store and each inbox also meets every broker.
// TXOUTBOX_MATRIX=full runs all 140 combinations.
func TestMatrix(t *testing.T) {
	tier.SkipShort(t)
	t.Parallel()
	stores := []struct {
		name string
		new  outboxtest.NewStoreFunc
	}{
		{"SQLXPostgres", func(t *testing.T) *outboxtest.StoreFixture {
			return fixtures.SQLXPostgres(t, fixtures.Options{SkipInbox: true})
		}},
		{"SQLXSQLite", func(t *testing.T) *outboxtest.StoreFixture {
			return fixtures.SQLXSQLite(t, fixtures.Options{SkipInbox: true})
		}},
		{"GORMPostgres", func(t *testing.T) *outboxtest.StoreFixture { return gormStore(t, openGORM(t, true), dialect.Postgres) }},
		{"GORMSQLite", func(t *testing.T) *outboxtest.StoreFixture { return gormStore(t, openGORM(t, false), dialect.SQLite) }},
		{"PGX", func(t *testing.T) *outboxtest.StoreFixture {
			return fixtures.PGXPostgres(t, fixtures.Options{SkipInbox: true})
		}},
		{"SQLXMariaDB", func(t *testing.T) *outboxtest.StoreFixture {
			return fixtures.SQLXMySQL(t, fixtures.Options{SkipInbox: true})
		}},
		{"GORMMariaDB", func(t *testing.T) *outboxtest.StoreFixture { return gormStore(t, openGORMMySQL(t), dialect.MySQL) }},
	}
	brokers := []struct {
		name string
		new  outboxtest.NewBrokerFunc
	}{
		{"GoChannel", goChannel},
		{"RabbitMQ", rabbitMQ},
		{"Kafka", kafka},
		{"NATS", natsJS},
	}
	inboxes := []struct {
		name string
		new  outboxtest.NewInboxFunc
	}{
		{"SQLPostgres", func(t *testing.T) *outboxtest.InboxFixture {
			return sqlInbox(t, testenv.OpenPostgres(t), dialect.Postgres)
		}},
		{"SQLSQLite", func(t *testing.T) *outboxtest.InboxFixture { return sqlInbox(t, openSQLite(t), dialect.SQLite) }},
		{"GORMPostgres", func(t *testing.T) *outboxtest.InboxFixture { return gormInbox(t, openGORM(t, true)) }},
		{"PGX", func(t *testing.T) *outboxtest.InboxFixture { return fixtures.PGXInbox(t) }},
		{"SQLMariaDB", func(t *testing.T) *outboxtest.InboxFixture { return sqlInbox(t, testenv.OpenMySQL(t), dialect.MySQL) }},
	}
	full := os.Getenv("TXOUTBOX_MATRIX") == "full" || tier.Long()
	for si, s := range stores {
		for bi, b := range brokers {
			for ii, in := range inboxes {
				if !full && bi != (si+ii)%len(brokers) {
					continue
				}
				t.Run(s.name+"/"+b.name+"/"+in.name, func(t *testing.T) {
					t.Parallel()
					outboxtest.RunExactlyOnce(t, s.new, b.new, in.new)
				})
			}
		}
	}
}

var quiet = slog.New(slog.DiscardHandler)

func openSQLite(t *testing.T) *sql.DB {
	return fixtures.OpenSQLite(t, filepath.Join(t.TempDir(), "db.sqlite")).DB
}

// openGORM opens GORM on a fresh PostgreSQL database or SQLite file, with
// the pure-Go SQLite driver underneath.
func openGORM(t *testing.T, pg bool) *gorm.DB {
	t.Helper()
	cfg := &gorm.Config{Logger: logger.Discard}
	var dial gorm.Dialector
	if pg {
		dial = postgres.New(postgres.Config{Conn: testenv.OpenPostgres(t)})
	} else {
		dial = sqlite.New(sqlite.Config{Conn: openSQLite(t)})
	}
	db, err := gorm.Open(dial, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// openGORMMySQL opens GORM on a fresh MariaDB database.
func openGORMMySQL(t *testing.T) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(mysql.New(mysql.Config{Conn: testenv.OpenMySQL(t, "parseTime=true")}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func gormStore(t *testing.T, db *gorm.DB, d dialect.Dialect) *outboxtest.StoreFixture {
	t.Helper()
	if err := gormoutbox.AutoMigrate(db, gormoutbox.MigrateOptions{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if err := db.Use(gormoutbox.Plugin{}); err != nil {
		t.Fatal(err)
	}
	return gormfixtures.Store(t, db, d)
}

func sqlInbox(t *testing.T, db *sql.DB, d dialect.Dialect) *outboxtest.InboxFixture {
	t.Helper()
	if err := dialect.Migrate(t.Context(), db, d, dialect.MigrateOptions{SkipOutbox: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), fixtures.EffectsDDL); err != nil {
		t.Fatal(err)
	}
	xdb := sqlx.NewDb(db, map[dialect.Dialect]string{dialect.Postgres: "pgx", dialect.SQLite: "sqlite", dialect.MySQL: "mysql"}[d])
	ib, err := sqlinbox.New(xdb, sqlinbox.Options{Dialect: d, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return &outboxtest.InboxFixture{
		Inbox: ib,
		Effect: func(ctx context.Context, key string) error {
			tx := sqlinbox.Txx(ctx)
			if tx == nil {
				return errors.New("no transaction in the handler's context")
			}
			_, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO effects (effect_key) VALUES (?)`), key)
			return err
		},
		Effects:   func(ctx context.Context) (map[string]int, error) { return fixtures.CountEffects(ctx, db) },
		Processed: ib.Processed,
		Cleaner:   ib,
	}
}

func gormInbox(t *testing.T, db *gorm.DB) *outboxtest.InboxFixture {
	t.Helper()
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	if err := dialect.Migrate(t.Context(), sqlDB, dialect.Postgres, dialect.MigrateOptions{SkipOutbox: true, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(fixtures.EffectsDDL).Error; err != nil {
		t.Fatal(err)
	}
	return gormfixtures.Inbox(t, db, dialect.Postgres)
}

func goChannel(t *testing.T) *outboxtest.BrokerFixture {
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, watermill.NopLogger{})
	t.Cleanup(func() { ps.Close() })
	return &outboxtest.BrokerFixture{Publisher: watermillbroker.NewPublisher(ps, watermillbroker.Options{}), Subscriber: ps}
}

func rabbitMQ(t *testing.T) *outboxtest.BrokerFixture {
	url := testenv.AMQPURL(t)
	pub, err := amqpbroker.NewPublisher(amqpbroker.Options{URL: url, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	sub, err := amqpbroker.NewSubscriber(amqpbroker.SubscriberOptions{URL: url, Consumer: "matrix-" + testenv.RandomSuffix(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return &outboxtest.BrokerFixture{Publisher: pub, Subscriber: sub}
}

// natsJS is a stream of the test's own on the shared nats-server.
func natsJS(t *testing.T) *outboxtest.BrokerFixture {
	url, sfx := testenv.NATSURL(t), testenv.RandomSuffix()
	stream, prefix := "M"+sfx, "m"+sfx
	pub, err := natsbroker.NewPublisher(t.Context(), natsbroker.Options{URL: url, Stream: stream, StreamSubjects: []string{prefix + ".>"},
		Subject: func(ev *core.Event) string { return prefix + "." + ev.EventType }, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	sub, err := natsbroker.NewSubscriber(natsbroker.SubscriberOptions{URL: url, Stream: stream, Consumer: "matrix", AckWait: 5 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return &outboxtest.BrokerFixture{Publisher: pub, Subscriber: sub, Topic: func(et string) string { return prefix + "." + et }}
}

func kafka(t *testing.T) *outboxtest.BrokerFixture {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4),
		kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	pub, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: c.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	sub, err := kafkabroker.NewSubscriber(kafkabroker.SubscriberOptions{
		Brokers: c.ListenAddrs(), ConsumerGroup: "matrix-" + testenv.RandomSuffix(),
		Client: fixtures.KafkaGroupTimings(), Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return &outboxtest.BrokerFixture{Publisher: pub, Subscriber: message.Subscriber(sub)}
}
