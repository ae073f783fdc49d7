// Package natsbroker publishes outbox events to NATS JetStream, on
// github.com/nats-io/nats.go's jetstream package, and reads them back as a
// Watermill message.Subscriber for the inbox.
//
//	pub, err := natsbroker.NewPublisher(ctx, natsbroker.Options{
//		URL:            "nats://127.0.0.1:4222",
//		Stream:         "ORDERS",
//		StreamSubjects: []string{"order.>"}, // create or update the stream
//	})
//	relay, err := core.NewRelay(store, pub, core.RelayOptions{})
//
// Subjects: an event goes to the subject Options.Subject names, by default
// its event type ("order.created"), which is already a NATS subject. The
// stream Options.Stream must capture it: every publish names the stream it
// expects, so that an event that some other stream, or none, would take
// fails with a clear error and stays in the outbox.
//
// Acknowledgements: an event counts as published only when JetStream
// acknowledged that it stored it. A batch is sent asynchronously and its
// acknowledgements are awaited together, so a batch costs about one round
// trip.
//
// Duplicates: each message carries the event ID as Nats-Msg-Id, so when a
// relay publishes an event again (it died after JetStream stored the event
// but before the outbox recorded it), JetStream drops the copy if it
// arrives within the stream's duplicate window (StreamConfig.Duplicates,
// two minutes by default, Options.DuplicateWindow when the publisher
// creates the stream). A copy sent later than that still reaches consumers,
// whose inbox absorbs it.
//
// Order: the events of one aggregate are stored in the order of the batch:
// an event is sent only once JetStream acknowledged the previous event of
// its aggregate, and when that one failed it is held back (ErrEarlierFailed)
// so that its retry cannot be overtaken. The publisher therefore reports
// that it keeps aggregate order (core.PublisherCapabilities) and a relay
// with the default core.OrderingAuto runs in ordered mode. Consumers see
// stream order, redeliveries included, when JetStream holds the next
// message back until the previous one is acknowledged: the Subscriber's
// durable consumers do by default (SubscriberOptions.MaxAckPending 1,
// shared by every instance of the consumer group); raise it for throughput
// where order does not matter.
//
// Headers: the event's headers (core.Event.MessageHeaders) become NATS
// headers. An event NATS can never carry (larger than the server's
// max_payload or the stream's max_msg_size, a subject that is not a valid
// literal subject, a header with a line break) fails alone and permanently
// (core.Permanent).
package natsbroker
