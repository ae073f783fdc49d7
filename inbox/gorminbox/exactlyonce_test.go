package gorminbox_test

import (
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/dialect"
	"github.com/txoutbox/txoutbox/internal/testkit/gormfixtures"
	"github.com/txoutbox/txoutbox/internal/testkit/testenv"
	outboxtest "github.com/txoutbox/txoutbox/testing"
)

// order is the producer's business row.
// TestExactlyOnceGORM runs the end-to-end suite with GORM on both sides:
// the producer enqueues through the GORM outbox plugin inside
// db.Transaction, and the consumer's handler writes through
// gorminbox.Tx, each on its own PostgreSQL database.
func TestExactlyOnceGORM(t *testing.T) {
	t.Parallel()
	producer := func(t *testing.T) *outboxtest.StoreFixture {
		sqlDB := testenv.OpenPostgres(t)
		if err := dialect.Migrate(t.Context(), sqlDB, dialect.Postgres, dialect.MigrateOptions{SkipInbox: true, Logger: slog.New(slog.DiscardHandler)}); err != nil {
			t.Fatal(err)
		}
		db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Use(gormoutbox.Plugin{}); err != nil {
			t.Fatal(err)
		}
		return gormfixtures.Store(t, db, dialect.Postgres)
	}
	broker := func(t *testing.T) *outboxtest.BrokerFixture {
		ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		t.Cleanup(func() { ps.Close() })
		return &outboxtest.BrokerFixture{Publisher: watermillbroker.NewPublisher(ps, watermillbroker.Options{}), Subscriber: ps}
	}
	outboxtest.RunExactlyOnce(t, producer, broker, func(t *testing.T) *outboxtest.InboxFixture { return newFixture(t, "postgres") })
}
