package kafkabroker_test

import (
	"database/sql"
	"log/slog"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/twmb/franz-go/pkg/kfake"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// TestOrderingAutoTurnsOrderedModeOn checks that the Kafka publisher reports
// that it keeps aggregate order, so that a relay with the default
// OrderingAuto and an ordered store runs in ordered mode.
func TestOrderingAutoTurnsOrderedModeOn(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	defer c.Close()
	pub, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: c.ListenAddrs()})
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	defer pub.Close()
	if !pub.Capabilities().PreservesAggregateOrder {
		t.Fatal("PreservesAggregateOrder() = false, want true")
	}

	db, err := sql.Open("sqlite", "file:"+t.TempDir()+"/outbox.db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store, err := sqlxoutbox.NewDB(db, sqlxoutbox.Options{Dialect: dialect.SQLite})
	if err != nil {
		t.Fatalf("sqlxoutbox.NewDB: %v", err)
	}
	quietLog := slog.New(slog.DiscardHandler)
	relay, err := core.NewRelay(store, pub, core.RelayOptions{Ordering: core.OrderingAuto, Logger: quietLog})
	if err != nil {
		t.Fatalf("NewRelay: %v", err)
	}
	if !relay.Ordered() {
		t.Error("relay with the Kafka publisher and an ordered store under OrderingAuto: Ordered() = false, want true")
	}
	relay, err = core.NewRelay(store, pub, core.RelayOptions{Ordering: core.OrderingOff, Logger: quietLog})
	if err != nil {
		t.Fatalf("NewRelay(OrderingOff): %v", err)
	}
	if relay.Ordered() {
		t.Error("OrderingOff: Ordered() = true, want false")
	}
}
