package main

import (
	"context"
	"sync"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// timedStore wraps a core.Store and records how long its claims and their
// commits take and how many events they hold, for the -v diagnostics of
// scenario c.
type timedStore struct {
	core.Store
	mu                  sync.Mutex
	claims, commits     []time.Duration
	empty, nonEmpty, ev int
	lastEnd             time.Time
	gaps                []time.Duration // from the end of one claim to the start of the next
}

func (s *timedStore) Claim(ctx context.Context, req core.ClaimRequest) (core.Claim, error) {
	t0 := time.Now()
	c, err := s.Store.Claim(ctx, req)
	d := time.Since(t0)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.claims = append(s.claims, d)
	if !s.lastEnd.IsZero() {
		s.gaps = append(s.gaps, t0.Sub(s.lastEnd))
	}
	if n := len(c.Events()); n == 0 {
		s.lastEnd = time.Now()
		s.empty++
	} else {
		s.nonEmpty++
		s.ev += n
	}
	s.mu.Unlock()
	return &timedClaim{Claim: c, s: s}, nil
}

// Unwrap implements core.StoreWrapper: the relay finds the wrapped store's
// wake-up signal and next due time there.
func (s *timedStore) Unwrap() core.Store { return s.Store }

type timedClaim struct {
	core.Claim
	s *timedStore
}

func (c *timedClaim) Commit(ctx context.Context, out core.Outcome) error {
	t0 := time.Now()
	err := c.Claim.Commit(ctx, out)
	c.s.mu.Lock()
	c.s.commits = append(c.s.commits, time.Since(t0))
	c.s.lastEnd = time.Now()
	c.s.mu.Unlock()
	return err
}

func (s *timedStore) summary() []any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return []any{"claims_empty", s.empty, "claims_with_events", s.nonEmpty, "events", s.ev,
		"claim_p50", percentile(s.claims, 0.5), "claim_p99", percentile(s.claims, 0.99),
		"commit_p50", percentile(s.commits, 0.5), "commit_p99", percentile(s.commits, 0.99),
		"gap_p50", percentile(s.gaps, 0.5), "gap_p90", percentile(s.gaps, 0.9), "gap_p99", percentile(s.gaps, 0.99),
		"claim_total", sum(s.claims), "commit_total", sum(s.commits), "gap_total", sum(s.gaps)}
}

func sum(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t
}
