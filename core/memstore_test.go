package core

import (
	"context"
	"slices"
	"sync"
	"time"
)

// memStore is an in-memory Store for unit tests of the relay loop only;
// stores are proven on real databases by the conformance suite.
type memStore struct {
	mu     sync.Mutex
	events []*Event
	held   map[int64]bool
	seq    int64
	now    func() time.Time
}

func newMemStore() *memStore {
	return &memStore{held: map[int64]bool{}, now: time.Now}
}

func (s *memStore) add(evs ...Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range evs {
		if err := ev.Prepare(); err != nil {
			panic(err)
		}
		s.seq++
		ev.Seq = s.seq
		ev.CreatedAt = s.now()
		ev.NextAttemptAt = ev.CreatedAt
		e := ev
		s.events = append(s.events, &e)
	}
}

func (s *memStore) get(seq int64) Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.events {
		if e.Seq == seq {
			return *e
		}
	}
	panic("no such event")
}

func (s *memStore) Claim(ctx context.Context, req ClaimRequest) (Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Event
	now := s.now()
	for _, e := range s.events {
		if len(out) == req.Limit {
			break
		}
		if e.PublishedAt == nil && e.DeadAt == nil && !s.held[e.Seq] && !e.NextAttemptAt.After(now) {
			s.held[e.Seq] = true
			out = append(out, *e)
		}
	}
	return &memClaim{s: s, events: out}, nil
}

type memClaim struct {
	s      *memStore
	events []Event
	done   bool
}

func (c *memClaim) Events() []Event { return c.events }

func (c *memClaim) Commit(ctx context.Context, out Outcome) error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.done {
		return ErrClaimDone
	}
	c.done = true
	now := c.s.now()
	for _, e := range c.s.events {
		if slices.Contains(out.Published, e.Seq) {
			e.PublishedAt = &now
			e.AttemptCount++
		}
		for _, f := range out.Failed {
			if f.Seq == e.Seq {
				e.AttemptCount++
				e.LastError = f.Err
				e.NextAttemptAt = now.Add(f.RetryIn)
				if f.Dead {
					e.DeadAt = &now
				}
			}
		}
	}
	c.release()
	return nil
}

func (c *memClaim) Release(ctx context.Context) error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.done {
		return ErrClaimDone
	}
	c.done = true
	c.release()
	return nil
}

func (c *memClaim) release() {
	for _, e := range c.events {
		delete(c.s.held, e.Seq)
	}
}
