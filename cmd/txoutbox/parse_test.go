package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

func TestParseDSN(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		dsn, driver, source, dialect string
	}{
		{"postgres://u:p@h:5432/db?sslmode=disable", "pgx", "postgres://u:p@h:5432/db?sslmode=disable", "postgres"},
		{"postgresql://h/db", "pgx", "postgresql://h/db", "postgres"},
		{"sqlite:app.db", "sqlite", "app.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate", "sqlite"},
		{"sqlite:///var/lib/app.db", "sqlite", "/var/lib/app.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate", "sqlite"},
		{"file:app.db?mode=rwc", "sqlite", "file:app.db?mode=rwc&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate", "sqlite"},
		{"mysql://u:p@h/db", "mysql", "u:p@tcp(h:3306)/db?interpolateParams=true", "mysql"},
		{"mariadb://u:p%40x@h:3307/db?parseTime=true", "mysql", "u:p@x@tcp(h:3307)/db?interpolateParams=true&parseTime=true", "mysql"},
		{"u:p@tcp(h:3306)/db?interpolateParams=false", "mysql", "u:p@tcp(h:3306)/db", "mysql"},
	} {
		driver, source, d, err := parseDSN(tc.dsn)
		if err != nil || driver != tc.driver || source != tc.source || d.Name() != tc.dialect {
			t.Errorf("parseDSN(%q) = %q, %q, %v, %v", tc.dsn, driver, source, d, err)
		}
	}
	for _, bad := range []string{"oracle://h/db", "sqlite:", "app.db", "mysql://u:p@h/db?tls=nosuch%zz"} {
		if _, _, _, err := parseDSN(bad); !errors.Is(err, ErrUsage) {
			t.Errorf("parseDSN(%q): %v, want ErrUsage", bad, err)
		}
	}
	if got := redact("postgres://app:s3cret@db/app"); strings.Contains(got, "s3cret") {
		t.Errorf("redact left the password: %s", got)
	}
	if got := redact("amqp://guest@rabbit/"); got != "amqp://guest@rabbit/" {
		t.Errorf("redact changed a URL without password: %s", got)
	}
}

func TestParseTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"24h":                  now.Add(-24 * time.Hour),
		"2026-12-01":           time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		"2026-12-01T10:30:00Z": time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC),
	} {
		if got, err := parseTime(in, now); err != nil || !got.Equal(want) {
			t.Errorf("parseTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := parseTime("yesterday", now); err == nil {
		t.Error("parseTime accepted 'yesterday'")
	}
}

func TestSink(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("log://?fail_types=b,c&delay=30ms")
	var out strings.Builder
	s, err := newSink(u, &out, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	evs := []core.Event{{ID: "1", EventType: "a", Payload: []byte(`{}`)}, {ID: "2", EventType: "b", Payload: []byte(`{}`)}}
	start := time.Now()
	err = s.Publish(context.Background(), evs)
	if time.Since(start) < 30*time.Millisecond {
		t.Error("delay not applied")
	}
	errs := core.EventErrors(err, 2)
	if errs[0] != nil || !errors.Is(errs[1], ErrSinkFailure) {
		t.Fatalf("errors %v", errs)
	}
	if strings.Count(out.String(), "\n") != 1 || !strings.Contains(out.String(), `"event_id":"1"`) {
		t.Fatalf("sink output %q", out.String())
	}
	// A cancelled context ends the delay: shutdown is not held up by it.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Publish(ctx, evs); !errors.Is(err, context.Canceled) {
		t.Fatalf("Publish with a cancelled context: %v", err)
	}
	for _, bad := range []string{"memory://?delay=soon", "memory://?colour=red"} {
		u, _ := url.Parse(bad)
		if _, err := newSink(u, io.Discard, nil); !errors.Is(err, ErrUsage) {
			t.Errorf("%s: %v, want ErrUsage", bad, err)
		}
	}
}

func TestOpenBrokerUsage(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", "rabbit", "nats://x", "nats://h:4222?stream=S&colour=red", "nats://h:4222?stream=S&ack_timeout=-1s", "amqp://h/?cloudevents=binary", "kafka://h:9092?cloudevents=envelope&cloudevents_source=/x", "log://?cloudevents=binary", "redis://x", "kafka://", "kafka://h:9092?acks=1", "sns://?colour=red",
		// Transactions only for a log relay (its ID is "" elsewhere), and
		// their parameters only with them.
		"kafka://h:9092?transactional=true", "kafka://h:9092?transactional_id=x", "kafka://h:9092?transactional=yes"} {
		if _, err := openBroker(context.Background(), bad, io.Discard, slog.New(slog.DiscardHandler), ""); !errors.Is(err, ErrUsage) {
			t.Errorf("openBroker(%q): %v, want ErrUsage", bad, err)
		}
	}
	for _, bad := range []string{"kafka://h:9092?transactional=true&transaction_timeout=soon", "kafka://h:9092?transactional=true&position_topic=a%20b"} {
		_, err := openBroker(context.Background(), bad, io.Discard, slog.New(slog.DiscardHandler), "txoutbox-slot")
		if !errors.Is(err, ErrUsage) && !errors.Is(err, core.ErrInvalidOptions) {
			t.Errorf("openBroker(%q) for a log relay: %v, want ErrUsage or core.ErrInvalidOptions", bad, err)
		}
	}
}
