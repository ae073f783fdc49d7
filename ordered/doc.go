// Package ordered is the partition leaser of txoutbox's ordered mode on
// PostgreSQL: events of one aggregate reach the broker in the order they
// were enqueued, even with several relays, retries and backoff
// (docs/ordering.md states the guarantee and its limits).
//
// Aggregates are hashed into a fixed number of partitions. A Leaser shares
// the partitions among the relays of one outbox table through lease rows:
// each relay heartbeats, takes its fair share (ceil(partitions / live
// relays)) of free or expired leases, renews them while alive and releases
// the excess when relays join, so that leases rebalance; a relay that dies
// loses its leases when they expire, and the others take them over. The
// store (sqlxoutbox.Outbox, the GORM store) claims for a relay only from its
// partitions, each claim holding a transaction-level advisory lock per
// partition, so that even while a lease changes hands no two claims serve
// one partition; and an event is claimed only when no earlier event of its
// aggregate is in backoff (or dead, under core.DeadLetterBlock). The relay
// publishes a batch in rounds so that an event never goes out before its
// predecessor in the batch was accepted.
//
// Nothing here needs wiring: the store offers a Leaser
// (core.LeaserSource), and a relay in ordered mode builds
// one and runs it:
//
//	store, _ := sqlxoutbox.NewDB(db, sqlxoutbox.Options{})
//	relay, _ := core.NewRelay(store, kafkaPublisher, core.RelayOptions{}) // ordered: Kafka keeps per-key order
//	err := relay.Run(ctx)                                                   // runs the leaser too
//
// Build a Leaser yourself (NewLeaser, passed as core.OrderedOptions.Leaser)
// to tune LeaseTTL, name the Owner or watch lease changes. The lease tables
// come from dialect.Migrate. SQLite runs one relay, without partitions or
// leases.
package ordered
