// Package core is the portable heart of txoutbox: the Event vocabulary, the
// small interfaces a storage adapter or broker implements (Store, Publisher,
// Inbox), and the machinery built on them: the Relay, its RetryPolicy,
// retention Cleanup and the lag Monitor.
//
// core depends on no ORM and no broker client. Storage adapters live in
// adapters/, publishers in brokers/, and the consumer-side inbox middleware in
// inbox/.
//
// The flow is:
//
//	producer tx:  business rows + Enqueue(tx, event) -> COMMIT
//	relay:        Store.Claim -> Publisher.Publish -> Claim.Commit(outcome)
//	consumer:     inbox: record (consumer, event_id) + handler writes -> COMMIT
//
// Delivery is at least once: a relay that crashes after publishing and before
// recording the outcome publishes the batch again. Every message carries the
// event's ID in the HeaderEventID header so that consumers can deduplicate.
package core
