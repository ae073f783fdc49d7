// Package snsbroker publishes outbox events to AWS SNS topics, on
// github.com/aws/aws-sdk-go-v2/service/sns.
//
// A Publisher is a batch-aware core.Publisher: the relay's batch goes out in
// PublishBatch calls of up to ten events per topic (and at most 256 KiB per
// call), and SNS's per-entry answers come back as a *core.BatchError, so the
// relay retries exactly the events SNS refused or did not confirm.
// Publisher.MessagePublisher is the same publisher as a Watermill
// message.Publisher.
//
//	client, err := snsbroker.NewClient(ctx, snsbroker.ClientOptions{Region: "eu-west-1"})
//	pub, err := snsbroker.NewPublisher(client, snsbroker.Options{CreateTopics: true})
//	relay, err := core.NewRelay(store, pub, core.RelayOptions{})
//
// Topics: Options.Topic names an event's topic (default TopicName of the
// event type, "order.created" -> "order_created"); the ARN comes from
// Options.TopicARNs, or CreateTopic once per topic (Options.CreateTopics,
// cached), or Options.TopicARNPrefix.
//
// Headers: the event's headers (core.Event.MessageHeaders: event_id,
// event_type, aggregate_type, aggregate_id and its own) become String message
// attributes. SNS delivers at most ten attributes to SQS and refuses empty
// values and some names, so when the headers do not all fit, the identity
// headers and then the others in name order take nine attributes and the
// rest travel as one JSON object in the attribute "txoutbox_headers"
// (Options.OverflowAttribute). Nothing is dropped; DecodeHeaders puts the
// headers back together on the consumer side, and ParseNotification opens
// the SNS envelope of a subscription without raw message delivery.
//
// FIFO topics (names ending in ".fifo"): MessageGroupId is the aggregate ID
// and MessageDeduplicationId the event ID. When an event of a group fails,
// the group's later events of the same batch are held back
// (ErrEarlierFailed) so that the retry cannot be overtaken. Set
// Options.FIFOOnly when every topic is a FIFO topic: the publisher then
// reports that it keeps aggregate order (core.PublisherCapabilities), so a
// relay with the default core.OrderingAuto runs in ordered mode, and it refuses events bound for a standard topic (ErrNotFIFO).
// Standard topics do not keep order, so without FIFOOnly it reports false.
package snsbroker
