package snsbroker_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	_ "modernc.org/sqlite"

	sqlxoutbox "github.com/txoutbox/txoutbox/adapters/sqlx"
	snsbroker "github.com/txoutbox/txoutbox/brokers/sns"
	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// acceptingAPI confirms every entry of every call and counts the calls.
type acceptingAPI struct{ calls atomic.Int32 }

func (a *acceptingAPI) Publish(context.Context, *sns.PublishInput, ...func(*sns.Options)) (*sns.PublishOutput, error) {
	a.calls.Add(1)
	return &sns.PublishOutput{MessageId: aws.String("m")}, nil
}

func (a *acceptingAPI) PublishBatch(_ context.Context, in *sns.PublishBatchInput, _ ...func(*sns.Options)) (*sns.PublishBatchOutput, error) {
	a.calls.Add(1)
	out := &sns.PublishBatchOutput{}
	for _, e := range in.PublishBatchRequestEntries {
		out.Successful = append(out.Successful, types.PublishBatchResultEntry{Id: e.Id, MessageId: aws.String("m")})
	}
	return out, nil
}

func (a *acceptingAPI) CreateTopic(_ context.Context, in *sns.CreateTopicInput, _ ...func(*sns.Options)) (*sns.CreateTopicOutput, error) {
	a.calls.Add(1)
	return &sns.CreateTopicOutput{TopicArn: aws.String("arn:aws:sns:eu-west-1:000000000000:" + aws.ToString(in.Name))}, nil
}

// TestOrderingAutoFIFOOnly checks that a publisher with FIFOOnly reports
// that it keeps aggregate order, so that a relay with the default
// OrderingAuto and an ordered store runs in ordered mode, and that one
// without it does not.
func TestOrderingAutoFIFOOnly(t *testing.T) {
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
	for _, tc := range []struct {
		name string
		opts snsbroker.Options
		want bool
	}{
		{"default", snsbroker.Options{CreateTopics: true}, false},
		{"FIFO topic names but no FIFOOnly", snsbroker.Options{TopicARNs: map[string]string{"orders.fifo": "arn:aws:sns:eu-west-1:000000000000:orders.fifo"}}, false},
		{"FIFOOnly", snsbroker.Options{CreateTopics: true, FIFOOnly: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Logger = quietLog
			pub, err := snsbroker.NewPublisher(&acceptingAPI{}, tc.opts)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if got := pub.Capabilities().PreservesAggregateOrder; got != tc.want {
				t.Errorf("PreservesAggregateOrder() = %t, want %t", got, tc.want)
			}
			relay, err := core.NewRelay(store, pub, core.RelayOptions{Ordering: core.OrderingAuto, Logger: quietLog})
			if err != nil {
				t.Fatalf("NewRelay: %v", err)
			}
			if relay.Ordered() != tc.want {
				t.Errorf("relay under OrderingAuto: Ordered() = %t, want %t", relay.Ordered(), tc.want)
			}
		})
	}
}

// TestFIFOOnlyRefusesStandardTopics checks that FIFOOnly holds: an event
// for a standard topic is not sent and fails with ErrNotFIFO, while events
// for FIFO topics go out.
func TestFIFOOnlyRefusesStandardTopics(t *testing.T) {
	api := &acceptingAPI{}
	pub, err := snsbroker.NewPublisher(api, snsbroker.Options{
		TopicARNs: map[string]string{
			"orders.fifo": "arn:aws:sns:eu-west-1:000000000000:orders.fifo",
			"audit":       "arn:aws:sns:eu-west-1:000000000000:audit",
		},
		Topic:    func(ev *core.Event) string { return ev.EventType },
		FIFOOnly: true,
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	events := []core.Event{
		{ID: "e1", EventType: "orders.fifo", AggregateID: "o1", Payload: []byte(`{}`)},
		{ID: "e2", EventType: "audit", AggregateID: "o1", Payload: []byte(`{}`)},
	}
	err = pub.Publish(context.Background(), events)
	var be *core.BatchError
	if !errors.As(err, &be) || len(be.Errs) != 2 {
		t.Fatalf("Publish = %v, want a *core.BatchError of 2", err)
	}
	if be.Errs[0] != nil {
		t.Errorf("event to the FIFO topic: %v, want published", be.Errs[0])
	}
	if !errors.Is(be.Errs[1], snsbroker.ErrNotFIFO) {
		t.Errorf("event to the standard topic: %v, want ErrNotFIFO", be.Errs[1])
	}
	if n := api.calls.Load(); n != 1 {
		t.Errorf("%d calls to SNS, want 1 (the FIFO topic's batch)", n)
	}
}
