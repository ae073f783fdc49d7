package core

import "sync"

// Notifier is told when events were enqueued, so that a relay can claim them
// without waiting for its poll interval. *Relay and *Signal are Notifiers;
// so is the LISTEN/NOTIFY sender of package pgnotify, which reaches relays
// in other processes. Notify must not block.
type Notifier interface {
	Notify()
}

// NotifierFunc adapts a function to Notifier.
type NotifierFunc func()

// Notify calls f.
func (f NotifierFunc) Notify() { f() }

// Signal is a same-process broadcast of "events were written": storage
// adapters notify it after every write (WakeupSource), and
// every relay running on the store is subscribed to it while it runs. The
// zero Signal is ready to use; it is safe for concurrent use.
type Signal struct {
	mu   sync.RWMutex
	subs map[*subscription]struct{}
}

type subscription struct{ fn func() }

// Notify calls every subscriber's function. The functions must not block
// (Relay.Notify does not).
func (s *Signal) Notify() {
	if s == nil {
		return
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for sub := range s.subs {
		sub.fn()
	}
}

// Subscribe adds fn to the subscribers until the returned function is
// called.
func (s *Signal) Subscribe(fn func()) (unsubscribe func()) {
	sub := &subscription{fn: fn}
	s.mu.Lock()
	if s.subs == nil {
		s.subs = map[*subscription]struct{}{}
	}
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.subs, sub)
		s.mu.Unlock()
	}
}
