// Package ordered runs txoutbox's ordered mode on database/sql: events of
// one aggregate reach the broker in the order they were enqueued, even with
// several relays, retries and backoff (docs/ordering.md states the guarantee
// and its limits).
//
// Aggregates are hashed into a fixed number of partitions. A Leaser shares
// the partitions among the relays of one outbox table through lease rows in
// PostgreSQL: each relay heartbeats, takes its fair share (ceil(partitions /
// live relays)) of free or expired leases, renews them while alive and
// releases the excess when relays join, so that leases rebalance; a relay
// that dies loses its leases when they expire, and the others take them
// over. A Store claims for a relay only from its partitions, each claim
// holding a transaction-level advisory lock per partition, so that even
// while a lease changes hands no two claims serve one partition; and an
// event is claimed only when no earlier event of its aggregate is in
// backoff (or dead, under core.DeadLetterBlock). The relay (core.Relay with
// Ordering: core.OrderingOn) publishes a batch in rounds so that an event
// never goes out before its predecessor in the batch was accepted.
//
//	leaser, _ := ordered.NewLeaser(db, dialect.Postgres, ordered.LeaserOptions{LeaseTTL: 10 * time.Second})
//	store, _ := ordered.NewStore(db, dialect.Postgres, ordered.StoreOptions{})
//	relay, _ := core.NewRelay(store, pub, core.RelayOptions{
//		Ordering: core.OrderingOn,
//		Ordered:  core.OrderedOptions{Leaser: leaser},
//	})
//	err := relay.Run(ctx) // runs the leaser too
//
// Create the indexes and lease tables with dialect.MigrateOrdered after
// dialect.Migrate. Producers keep writing with any adapter (adapters/sqlx,
// adapters/gorm): ordered mode changes only how events are claimed.
//
// SQLite runs one relay: Store serves ordered claims there without
// partitions or leases.
package ordered
