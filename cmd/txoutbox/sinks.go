package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// ErrSinkFailure is the error of events a log:// or memory:// sink was told
// to fail (?fail_types=...), for rehearsing retries and dead letters.
var ErrSinkFailure = errors.New("sink: failure requested by fail_types or fail_once_types")

// sink is the log:// and memory:// publisher for trying the relay out
// without a broker.
//
//	log://     prints every event as one JSON line on stdout
//	memory://  accepts and discards every event (a dry run; see the metrics)
//
// Both take query parameters:
//
//	delay=200ms          wait this long per batch, like a slow broker
//	fail_types=a,b       fail every event of these types
//	fail_once_types=a,b  fail the first attempt of every event of these types
type sink struct {
	out       io.Writer // nil for memory://
	mu        sync.Mutex
	delay     time.Duration
	failTypes map[string]bool
	failOnce  map[string]bool
	log       *slog.Logger
	accepted  atomic.Int64
}

// Capabilities implements core.Publisher: a sink promises no order.
func (s *sink) Capabilities() core.PublisherCapabilities { return core.PublisherCapabilities{} }

func newSink(u *url.URL, stdout io.Writer, log *slog.Logger) (*sink, error) {
	s := &sink{failTypes: map[string]bool{}, failOnce: map[string]bool{}, log: log}
	if u.Scheme == "log" {
		s.out = stdout
	}
	q := u.Query()
	if err := checkParams(u.Scheme, q); err != nil {
		return nil, err
	}
	if v := q.Get("delay"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return nil, usagef("%s:// sink: delay=%q is not a duration", u.Scheme, v)
		}
		s.delay = d
	}
	for _, t := range splitList(q.Get("fail_types")) {
		s.failTypes[t] = true
	}
	for _, t := range splitList(q.Get("fail_once_types")) {
		s.failOnce[t] = true
	}
	return s, nil
}

// sinkLine is what log:// prints per event.
type sinkLine struct {
	EventID       string            `json:"event_id"`
	Seq           int64             `json:"seq"`
	EventType     string            `json:"event_type"`
	AggregateType string            `json:"aggregate_type,omitempty"`
	AggregateID   string            `json:"aggregate_id,omitempty"`
	Attempt       int               `json:"attempt"`
	SentAt        time.Time         `json:"sent_at"`
	Headers       map[string]string `json:"headers"`
	Payload       json.RawMessage   `json:"payload"`
}

// Publish implements core.Publisher.
func (s *sink) Publish(ctx context.Context, events []core.Event) error {
	if s.delay > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(s.delay):
		}
	}
	be := core.NewBatchError(len(events))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range events {
		ev := &events[i]
		if s.failTypes[ev.EventType] || (s.failOnce[ev.EventType] && ev.AttemptCount == 0) {
			be.Errs[i] = fmt.Errorf("%w: %s event %s, attempt %d", ErrSinkFailure, ev.EventType, ev.ID, ev.AttemptCount+1)
			continue
		}
		if s.out != nil {
			b, err := json.Marshal(sinkLine{
				EventID: ev.ID, Seq: ev.Seq, EventType: ev.EventType, AggregateType: ev.AggregateType,
				AggregateID: ev.AggregateID, Attempt: ev.AttemptCount + 1, SentAt: time.Now().UTC(), Headers: ev.MessageHeaders(), Payload: ev.Payload,
			})
			if err != nil {
				be.Errs[i] = fmt.Errorf("sink: encode event %s: %w", ev.ID, err)
				continue
			}
			if _, err := fmt.Fprintf(s.out, "%s\n", b); err != nil {
				be.Errs[i] = fmt.Errorf("sink: write event %s: %w", ev.ID, err)
				continue
			}
		}
		s.accepted.Add(1)
		s.log.Debug("txoutbox: sink accepted event", "event_id", ev.ID, "seq", ev.Seq, "event_type", ev.EventType,
			"attempt", ev.AttemptCount+1)
	}
	return be.ErrOrNil()
}

// Close implements io.Closer.
func (s *sink) Close() error { return nil }
