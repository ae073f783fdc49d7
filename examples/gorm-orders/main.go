// Command gorm-orders is a small order service on GORM: POST /orders
// creates an order, and the order's order.created event is written to the
// outbox in the same transaction by the txoutbox GORM plugin. A relay in the
// same process publishes the event to Watermill's in-process GoChannel at
// once (the plugin wakes it on commit), and a subscriber logs it.
//
//	go run ./examples/gorm-orders                      # SQLite in ./gorm-orders.db
//	go run ./examples/gorm-orders -dsn 'postgres://...' # PostgreSQL
//	go run ./examples/gorm-orders -dsn 'mysql://...'    # MySQL 8 or MariaDB 10.6+
//	curl -s -XPOST localhost:8080/orders -d '{"buyer_id":"b-42","total":1999}'
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	_ "modernc.org/sqlite" // the pure-Go "sqlite" database/sql driver

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	watermillbroker "github.com/txoutbox/txoutbox/brokers/watermill"
	"github.com/txoutbox/txoutbox/core"
)

// Order is the service's GORM model. It declares its event by implementing
// gormoutbox.EventSource.
type Order struct {
	ID        int64     `gorm:"primaryKey" json:"id"`
	BuyerID   string    `gorm:"not null" json:"buyer_id"`
	Total     int64     `gorm:"not null" json:"total"` // in cents
	CreatedAt time.Time `json:"created_at"`
}

// OrderCreated is the payload of the order.created event.
type OrderCreated struct {
	OrderID   int64     `json:"order_id"`
	BuyerID   string    `json:"buyer_id"`
	Total     int64     `json:"total"`
	CreatedAt time.Time `json:"created_at"`
}

// EventOrderCreated is the type (and topic) of the event of a new order.
const EventOrderCreated = "order.created"

// OutboxEvents returns order.created when the order is created. GORM has
// run the INSERT already, so the generated ID and CreatedAt are set.
func (o *Order) OutboxEvents(op gormoutbox.Op) ([]core.Event, error) {
	if op != gormoutbox.Create {
		return nil, nil
	}
	ev, err := core.NewEvent("order", strconv.FormatInt(o.ID, 10), EventOrderCreated,
		OrderCreated{OrderID: o.ID, BuyerID: o.BuyerID, Total: o.Total, CreatedAt: o.CreatedAt})
	if err != nil {
		return nil, err
	}
	return []core.Event{ev}, nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "HTTP listen address")
	dsn := flag.String("dsn", "", "PostgreSQL (postgres://...) or MySQL/MariaDB (mysql://user:pass@host:3306/db) URL; empty uses SQLite")
	file := flag.String("sqlite", "gorm-orders.db", "SQLite database file, when -dsn is empty")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, *dsn, *file, log); err != nil {
		log.Error("gorm-orders failed", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr, dsn, file string, log *slog.Logger) error {
	a, err := newApp(ctx, dsn, file, log)
	if err != nil {
		return err
	}
	defer a.Close()
	go a.logPublished(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- a.relay.Run(ctx) }()

	srv := &http.Server{Addr: addr, Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.ListenAndServe() }()
	log.Info("gorm-orders listening", "addr", addr, "database", a.db.Dialector.Name())
	select {
	case err := <-srvDone:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdownCtx)
	return errors.Join(err, <-relayDone)
}

// app is the service: the database, the relay and the broker.
type app struct {
	db     *gorm.DB
	relay  *core.Relay
	broker *gochannel.GoChannel
	log    *slog.Logger
}

// newApp opens and migrates the database (PostgreSQL or MySQL for a
// non-empty dsn, else SQLite in file) and wires the plugin, the store and
// the relay.
// pollInterval is how often the relay looks for events it was not woken
// for.
var pollInterval = 5 * time.Second

func newApp(ctx context.Context, dsn, file string, log *slog.Logger) (*app, error) {
	gcfg := &gorm.Config{Logger: logger.Discard}
	var dialector gorm.Dialector
	switch {
	case strings.HasPrefix(dsn, "mysql://"):
		cfg, err := mysqlConfig(dsn)
		if err != nil {
			return nil, err
		}
		dialector = gormmysql.Open(cfg.FormatDSN())
	case dsn != "":
		dialector = postgres.Open(dsn)
	default:
		// modernc.org/sqlite (pure Go) under GORM's SQLite dialector: WAL
		// and immediate transactions let the HTTP handlers and the relay
		// queue for SQLite's single writer instead of failing.
		sqlDB, err := sql.Open("sqlite", "file:"+file+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_txlock=immediate")
		if err != nil {
			return nil, err
		}
		dialector = sqlite.New(sqlite.Config{Conn: sqlDB})
	}
	db, err := gorm.Open(dialector, gcfg)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	if dsn != "" {
		// database/sql, under GORM, keeps two idle connections by
		// default: the HTTP handlers and the relay beyond two would each
		// open a server connection per transaction.
		sqlDB, err := db.DB()
		if err != nil {
			return nil, err
		}
		sqlDB.SetMaxOpenConns(16)
		sqlDB.SetMaxIdleConns(16)
	}
	if err := db.WithContext(ctx).AutoMigrate(&Order{}); err != nil {
		return nil, fmt.Errorf("migrate orders: %w", err)
	}
	if err := gormoutbox.AutoMigrate(db.WithContext(ctx), gormoutbox.MigrateOptions{Logger: log}); err != nil {
		return nil, fmt.Errorf("migrate outbox: %w", err)
	}

	// Installed on the *gorm.DB of gorm.Open, which every session derives
	// from.
	if err := db.Use(gormoutbox.Plugin{}); err != nil {
		return nil, fmt.Errorf("install the outbox plugin: %w", err)
	}
	broker := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, watermill.NewSlogLogger(log))
	pub := watermillbroker.NewPublisher(broker, watermillbroker.Options{})
	store, err := gormoutbox.NewStore(db, gormoutbox.StoreOptions{Logger: log})
	if err != nil {
		return nil, err
	}
	// The poll is only the fallback: the plugin's commits wake the relay
	// running on the store.
	relay, err := core.NewRelay(store, pub, core.RelayOptions{PollInterval: pollInterval, Logger: log})
	if err != nil {
		return nil, err
	}
	return &app{db: db, relay: relay, broker: broker, log: log}, nil
}

// Close closes the broker and the database.
func (a *app) Close() error {
	err := a.broker.Close()
	if sqlDB, derr := a.db.DB(); derr == nil {
		err = errors.Join(err, sqlDB.Close())
	}
	return err
}

// Handler routes POST /orders.
func (a *app) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", a.createOrder)
	return mux
}

// createOrderRequest is the body of POST /orders.
type createOrderRequest struct {
	BuyerID string `json:"buyer_id"`
	Total   int64  `json:"total"`
}

func (a *app) createOrder(w http.ResponseWriter, r *http.Request) {
	var req createOrderRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&req); err != nil {
		http.Error(w, "invalid JSON: "+err.Error(), http.StatusBadRequest)
		return
	}
	if req.BuyerID == "" || req.Total <= 0 {
		http.Error(w, "buyer_id and a positive total are required", http.StatusBadRequest)
		return
	}
	o := Order{BuyerID: req.BuyerID, Total: req.Total}
	// One transaction: the order and its order.created event.
	if err := a.db.WithContext(r.Context()).Create(&o).Error; err != nil {
		a.log.Error("create order", "error", err)
		http.Error(w, "could not create the order", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(o)
}

// logPublished logs every order.created message the relay published, as a
// consumer would see it.
func (a *app) logPublished(ctx context.Context) {
	msgs, err := a.broker.Subscribe(ctx, EventOrderCreated)
	if err != nil {
		a.log.Error("subscribe", "error", err)
		return
	}
	for msg := range msgs {
		a.log.Info("published", "event_id", msg.Metadata.Get(core.HeaderEventID),
			"event_type", msg.Metadata.Get(core.HeaderEventType), "payload", string(msg.Payload))
		msg.Ack()
	}
}

// subscribe is for tests: the messages of one topic.
func (a *app) subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	return a.broker.Subscribe(ctx, topic)
}

// mysqlConfig turns mysql://user:pass@host:port/db?params into the
// driver's configuration, with parseTime on: GORM needs it to read
// DATETIME columns into time.Time.
func mysqlConfig(rawURL string) (*mysql.Config, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, errors.New("the MySQL URL does not parse") // its error would quote the password
	}
	cfg, err := mysql.ParseDSN("tcp(" + u.Host + ")" + u.Path + "?" + u.RawQuery)
	if err != nil {
		return nil, err
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.ParseTime = true
	return cfg, nil
}
