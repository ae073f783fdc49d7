// Package outboxtest is txoutbox's conformance suite and fault-injection kit.
//
// An adapter's author proves an implementation by calling the suite from an
// ordinary test, with a function that makes a fresh fixture on a real server
// for every subtest:
//
//	func TestConformance(t *testing.T) {
//		outboxtest.RunStore(t, func(t *testing.T) *outboxtest.StoreFixture { ... })
//	}
//
// RunStore proves a core.Store (with its Stats and Cleaner); RunPublisher
// proves a broker's core.Publisher against a subscriber reading from the same
// broker; RunEndToEnd drives the real core.Relay from a store through a
// broker; RunOutage takes the broker down and proves nothing is lost.
// RunInbox proves a core.Inbox, and RunExactlyOnce runs producer, outbox,
// relay (through a Faulty publisher that also duplicates), broker and inbox
// together, checking that every committed event takes effect exactly once
// in the consumer's own table and no rolled-back event ever does.
//
// The fault injectors (Faulty, Recorder) are for users' own tests too: a
// publisher that refuses a fraction of events, reports failure after the
// broker already took them (so the retry duplicates), duplicates them
// outright, or is slow.
package outboxtest
