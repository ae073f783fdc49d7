package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	amqpbroker "github.com/txoutbox/txoutbox/brokers/amqp"
	"github.com/txoutbox/txoutbox/brokers/cloudevent"
	kafkabroker "github.com/txoutbox/txoutbox/brokers/kafka"
	"github.com/txoutbox/txoutbox/core"
)

// brokerHelp is the part of relay --help that documents broker URLs.
const brokerHelp = `Broker URLs (--broker):
  log://                     print each event as a JSON line on stdout (try it out)
  memory://                  accept and discard every event (dry run)
      both take ?delay=200ms (slow broker), ?fail_types=a,b (fail those types)
      and ?fail_once_types=a,b (fail the first attempt of those types)
  amqp://user:pass@host:5672/vhost   RabbitMQ with publisher confirms (amqps:// for TLS)
      ?exchange=NAME             one exchange for all events, topic = routing key
      ?exchange_type=topic|direct
      ?consumers=billing,mailer  declare these consumers' queues before publishing
  kafka://host1:9092,host2:9092     Kafka, acks=all, idempotent producer
      ?transactional=true        with --mode log: each batch in a Kafka transaction with the
                                 log position, so read_committed consumers see each event once
                                 (its transactional ID is txoutbox-SLOT or txoutbox-STREAM)
      ?transactional_id=NAME     that ID instead
      ?position_topic=NAME       where positions are stored (default txoutbox-positions)
      ?transaction_timeout=1m    the transaction timeout
  sns://?region=eu-west-1&create_topics=true   AWS SNS
      ?endpoint=http://localhost:4100  an emulator or a VPC endpoint
      ?topic_arn_prefix=arn:aws:sns:eu-west-1:123456789012:
  nats://user:pass@host:4222?stream=ORDERS   NATS JetStream, acknowledged publishes,
      the event ID as Nats-Msg-Id (tls:// for TLS is nats://...?tls=true)
      ?stream=NAME               the stream that stores the events (required)
      ?subjects=order.>,pay.>    create the stream with these subjects (or update it)
      ?duplicate_window=2m       its duplicate window when created or updated
      ?ack_timeout=10s           how long to wait for JetStream's acknowledgement
  The topic of an event is its event type.
  Every broker but log:// and memory:// also takes
      ?cloudevents=binary|structured  send events as CloudEvents 1.0 (binary: attributes
                                      as headers; structured: the JSON event as the body)
      ?cloudevents_source=/orders     their source attribute (required with cloudevents)`

// publisher is what relay publishes to, and closes on shutdown.
type publisher interface {
	core.Publisher
	io.Closer
}

// brokerParams are the query parameters each broker scheme takes; any
// other is refused, so that a misspelt one (?consumer= for ?consumers=)
// does not pass unnoticed.
var brokerParams = map[string][]string{
	"log":    {"delay", "fail_types", "fail_once_types"},
	"memory": {"delay", "fail_types", "fail_once_types"},
	// Ours, then those of the AMQP client's URI.
	"amqp":  {"exchange", "exchange_type", "consumers", "heartbeat", "connection_timeout", "channel_max", "frame_max", "auth_mechanism"},
	"amqps": {"exchange", "exchange_type", "consumers", "heartbeat", "connection_timeout", "channel_max", "frame_max", "auth_mechanism", "certfile", "keyfile", "cacertfile", "server_name_indication"},
	"kafka": {"transactional", "transactional_id", "position_topic", "transaction_timeout"},
	"sns":   {"region", "endpoint", "create_topics", "topic_arn_prefix", "max_batch_size", "fifo_only"},
	"nats":  {"stream", "subjects", "duplicate_window", "ack_timeout", "tls"},
}

// cloudEventsParams are the parameters every real broker takes besides its
// own.
var cloudEventsParams = []string{"cloudevents", "cloudevents_source"}

// cloudEvents returns the CloudEvents options of a broker URL's query, nil
// when it asks for none.
func cloudEvents(q url.Values) (*cloudevent.Options, error) {
	mode, source := q.Get("cloudevents"), q.Get("cloudevents_source")
	if mode == "" && source == "" {
		return nil, nil
	}
	o := &cloudevent.Options{Mode: cloudevent.Mode(mode), Source: source}
	if mode == "" {
		o.Mode = cloudevent.Binary
	}
	if err := o.Validate(); err != nil {
		return nil, usagef("broker: %v (cloudevents=binary|structured&cloudevents_source=/your-service)", err)
	}
	return o, nil
}

// checkBrokerURL refuses a broker URL that cannot work, before anything
// connects: no scheme, an unknown scheme, an unknown parameter, a URL that
// does not parse. Its errors wrap ErrUsage and never print a password.
func checkBrokerURL(rawURL string) error {
	if rawURL == "" {
		return usagef("no broker: pass --broker or set %s (try --broker log://)", envName("broker"))
	}
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return usagef("the broker is not a URL (want log://, memory://, amqp://, kafka://, sns:// or nats://)")
	}
	if _, ok := brokerParams[scheme]; !ok {
		return usagef("unsupported broker scheme %q (want log, memory, amqp, amqps, kafka, sns or nats)", scheme)
	}
	var query url.Values
	if scheme == "kafka" {
		// host1:9092,host2:9092 is no URL host: only the query is parsed.
		_, q, _ := strings.Cut(rest, "?")
		var err error
		if query, err = url.ParseQuery(q); err != nil {
			return usagef("broker %s: %v", redact(rawURL), err)
		}
	} else {
		u, err := url.Parse(rawURL)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // without the URL, which holds the password
			}
			return usagef("broker %s: %v", redact(rawURL), err)
		}
		query = u.Query()
	}
	return checkParams(scheme, query)
}

// kafkaTransactional reads a kafka:// URL's transaction parameters; nil
// when it asks for none.
func kafkaTransactional(q url.Values, txID string) (*kafkabroker.Transactional, error) {
	on := q.Get("transactional")
	switch on {
	case "", "false":
		if q.Get("transactional_id") != "" || q.Get("position_topic") != "" || q.Get("transaction_timeout") != "" {
			return nil, usagef("kafka:// ?transactional_id, ?position_topic and ?transaction_timeout need ?transactional=true")
		}
		return nil, nil
	case "true":
	default:
		return nil, usagef("kafka:// ?transactional=%q: want true or false", on)
	}
	if txID == "" {
		return nil, usagef("kafka:// ?transactional=true needs a relay in log mode (--mode log, or mode: log in --config): its batches carry the log position that makes them exactly once; elsewhere each relay would fence the others (see docs/kafka-exactly-once.md)")
	}
	tx := &kafkabroker.Transactional{ID: cmp.Or(q.Get("transactional_id"), txID), PositionTopic: q.Get("position_topic")}
	if s := q.Get("transaction_timeout"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return nil, usagef("kafka:// ?transaction_timeout=%q: want a positive duration such as 1m", s)
		}
		tx.Timeout = d
	}
	return tx, nil
}

// checkParams refuses a query parameter the broker scheme does not take.
func checkParams(scheme string, query url.Values) error {
	params := brokerParams[scheme]
	if scheme != "log" && scheme != "memory" {
		params = append(slices.Clip(params), cloudEventsParams...)
	}
	for k := range query {
		if !slices.Contains(params, k) {
			want := "none"
			if len(params) > 0 {
				want = strings.Join(params, ", ")
			}
			return usagef("%s:// broker: unknown parameter %q (it takes: %s)", scheme, k, want)
		}
	}
	return nil
}

// openBroker connects to the broker of rawURL. txID is the Kafka
// transactional ID that ?transactional=true takes when the URL names none:
// the log relay's (txoutbox-SLOT), or "" where transactions are refused.
func openBroker(ctx context.Context, rawURL string, stdout io.Writer, log *slog.Logger, txID string) (publisher, error) {
	if err := checkBrokerURL(rawURL); err != nil {
		return nil, err
	}
	scheme, rest, _ := strings.Cut(rawURL, "://")
	switch scheme {
	case "log", "memory":
		u, _ := url.Parse(rawURL)
		return newSink(u, stdout, log)
	case "amqp", "amqps":
		u, _ := url.Parse(rawURL)
		q := u.Query()
		ce, err := cloudEvents(q)
		if err != nil {
			return nil, err
		}
		opts := amqpbroker.Options{
			Topology:    amqpbroker.Topology{Exchange: q.Get("exchange"), ExchangeType: q.Get("exchange_type")},
			CloudEvents: ce,
			Logger:      log,
		}
		if c := q.Get("consumers"); c != "" {
			opts.Consumers = splitList(c)
		}
		// Our parameters are not the AMQP client's: take them out of the
		// URL it dials.
		for _, k := range append([]string{"exchange", "exchange_type", "consumers"}, cloudEventsParams...) {
			q.Del(k)
		}
		u.RawQuery = q.Encode()
		opts.URL = u.String()
		p, err := amqpbroker.NewPublisher(opts)
		if err != nil {
			return nil, fmt.Errorf("connect to %s: %w", redact(rawURL), err)
		}
		return p, nil
	case "kafka":
		hosts, query, _ := strings.Cut(rest, "?")
		q, _ := url.ParseQuery(query) // checked by checkBrokerURL
		ce, err := cloudEvents(q)
		if err != nil {
			return nil, err
		}
		var brokers []string
		for _, h := range splitList(strings.TrimSuffix(hosts, "/")) {
			// Credentials go in a sarama configuration, never the URL: a
			// user:pass@ prefix is dropped so that sarama never sees it.
			if at := strings.LastIndex(h, "@"); at >= 0 {
				return nil, usagef("kafka:// takes no credentials in the URL (use SASL settings; see docs/brokers-amqp-kafka.md)")
			}
			brokers = append(brokers, h)
		}
		if len(brokers) == 0 {
			return nil, usagef("kafka:// needs at least one host:port")
		}
		tx, err := kafkaTransactional(q, txID)
		if err != nil {
			return nil, err
		}
		p, err := kafkabroker.NewPublisher(kafkabroker.Options{Brokers: brokers, CloudEvents: ce, Transactional: tx})
		if err != nil {
			return nil, fmt.Errorf("connect to kafka %v: %w", brokers, err)
		}
		return p, nil
	case "sns":
		return openSNS(ctx, rawURL, log)
	case "nats":
		return openNATS(ctx, rawURL, log)
	}
	return nil, usagef("unsupported broker scheme %q", scheme)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
