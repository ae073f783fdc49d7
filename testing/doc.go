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
// broker, including a broker outage when the fixture can cause one.
//
// The fault injectors (Faulty, Recorder) are for users' own tests too: a
// publisher that refuses a fraction of events, reports failure after the
// broker already took them (so the retry duplicates), duplicates them
// outright, or is slow.
package outboxtest
