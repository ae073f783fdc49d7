package core

// Notifier is told when events were enqueued, so that a relay can claim them
// without waiting for its poll interval. *Relay is a Notifier; so is the
// LISTEN/NOTIFY sender of a PostgreSQL adapter. Notify must not block.
type Notifier interface {
	Notify()
}

// NotifierFunc adapts a function to Notifier.
type NotifierFunc func()

// Notify calls f.
func (f NotifierFunc) Notify() { f() }
