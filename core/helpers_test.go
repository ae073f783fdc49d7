package core_test

import (
	"context"
	"sync/atomic"
	"time"

	memoutbox "github.com/txoutbox/txoutbox/adapters/memory"
	"github.com/txoutbox/txoutbox/core"
)

// testStore is the reference in-memory store with the shorthands the relay
// tests use: add commits events at once, get reads one back by Seq.
// Its clock runs ahead by skew, so that tests can end a backoff.
type testStore struct {
	*memoutbox.Store
	skew atomic.Int64
}

func newMemStore() *testStore {
	s := &testStore{}
	s.Store = memoutbox.New(memoutbox.Options{Now: func() time.Time { return time.Now().Add(time.Duration(s.skew.Load())) }})
	return s
}

// advance moves the store's clock forward by d.
func (s *testStore) advance(d time.Duration) { s.skew.Add(int64(d)) }

func (s *testStore) add(evs ...core.Event) {
	tx := s.Begin()
	if err := s.Enqueue(context.Background(), tx, evs...); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
}

func (s *testStore) get(seq int64) core.Event {
	for _, ev := range s.Events() {
		if ev.Seq == seq {
			return ev
		}
	}
	panic("no such event")
}
