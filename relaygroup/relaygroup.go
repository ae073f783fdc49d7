// Package relaygroup runs many relays in one process: one per outbox, for
// services with a database per tenant or sharded databases, where a relay
// process per outbox does not scale.
//
// A Group runs its members side by side, each in its own goroutine with
// its own context. One member's failure never stops the others: a member
// whose Run returns an error is started again after a backoff. Set
// replaces the members while the group runs (a configuration reload):
// members that are new start, members that are gone stop after their
// batch in flight, members whose Spec changed restart, the others run on
// untouched.
//
// The group has no coordinator of its own: several processes may run the
// same members, and each outbox's database arbitrates between their
// relays as it does for relays of one outbox (FOR UPDATE SKIP LOCKED,
// partition leases, log mode's stream lock).
package relaygroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/txoutbox/txoutbox/core"
)

// Member is one outbox's relay in a Group.
type Member struct {
	// Name identifies the member (the outbox) in the group, its logs and
	// Status. It must be unique and not empty.
	Name string
	// Spec describes the member's configuration; Set restarts a running
	// member whose Spec changed, and leaves one whose Spec is the same.
	Spec string
	// Run relays until ctx ends and then returns nil (as core.Relay.Run
	// does). An error makes the group start it again after a backoff.
	Run func(ctx context.Context) error
}

// Options configures a Group.
type Options struct {
	// Logger receives one line when a member stops with an error and one
	// when it is started again. Default slog.Default().
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the wait before a failed member is
	// started again; it doubles from one to the other while the member
	// keeps failing. Defaults 1s and 30s.
	MinBackoff, MaxBackoff time.Duration
}

// Status is what the group knows of one member.
type Status struct {
	Name string
	// Running: the member's Run is running now (not waiting to restart).
	Running bool
	// Restarts counts the times Run returned an error and was started
	// again.
	Restarts int
	// LastError is the latest error Run returned, "" when none.
	LastError string
}

// Group runs members. Its methods are safe for concurrent use.
type Group struct {
	opts Options
	log  *slog.Logger

	mu      sync.Mutex
	ctx     context.Context // of Run; nil before Run and after it returned
	members map[string]*running
	wg      sync.WaitGroup
}

type running struct {
	m      Member
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	up       bool
	restarts int
	lastErr  string
}

// New returns a Group with no members.
func New(opts Options) (*Group, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MinBackoff == 0 {
		opts.MinBackoff = time.Second
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.MinBackoff < 0 || opts.MaxBackoff < opts.MinBackoff {
		return nil, fmt.Errorf("%w: relaygroup: MinBackoff %s and MaxBackoff %s: want 0 < MinBackoff <= MaxBackoff",
			core.ErrInvalidOptions, opts.MinBackoff, opts.MaxBackoff)
	}
	return &Group{opts: opts, log: opts.Logger, members: map[string]*running{}}, nil
}

// Set replaces the group's members. It checks them first and changes
// nothing when one is invalid (an error wrapping core.ErrInvalidOptions).
// While the group runs, new members start at once, removed ones stop
// (Set waits for them, so that a removed outbox has no relay left when
// Set returns), and changed ones restart.
func (g *Group) Set(members []Member) error {
	seen := map[string]bool{}
	for _, m := range members {
		switch {
		case m.Name == "":
			return fmt.Errorf("%w: relaygroup: a member has no name", core.ErrInvalidOptions)
		case seen[m.Name]:
			return fmt.Errorf("%w: relaygroup: two members are named %q", core.ErrInvalidOptions, m.Name)
		case m.Run == nil:
			return fmt.Errorf("%w: relaygroup: member %q has no Run", core.ErrInvalidOptions, m.Name)
		}
		seen[m.Name] = true
	}
	g.mu.Lock()
	var stopping []*running
	for name, r := range g.members {
		if !seen[name] {
			stopping = append(stopping, r)
			delete(g.members, name)
		}
	}
	for _, m := range members {
		r, ok := g.members[m.Name]
		if ok && r.m.Spec == m.Spec {
			continue
		}
		if ok {
			stopping = append(stopping, r)
		}
		r = &running{m: m}
		g.members[m.Name] = r
		if g.ctx != nil {
			g.start(r)
		}
	}
	g.mu.Unlock()
	for _, r := range stopping {
		if r.cancel != nil {
			r.cancel()
			<-r.done
		}
	}
	return nil
}

// Run runs the members until ctx ends, then stops them all and returns
// nil once they returned. Run may not be called twice at once.
func (g *Group) Run(ctx context.Context) error {
	g.mu.Lock()
	if g.ctx != nil {
		g.mu.Unlock()
		return fmt.Errorf("%w: relaygroup: Run is already running", core.ErrInvalidOptions)
	}
	g.ctx = ctx
	for _, r := range g.members {
		g.start(r)
	}
	g.mu.Unlock()
	<-ctx.Done()
	g.mu.Lock()
	g.ctx = nil
	g.mu.Unlock()
	g.wg.Wait()
	return nil
}

// start runs r's loop; g.mu is held and g.ctx set.
func (g *Group) start(r *running) {
	ctx, cancel := context.WithCancel(g.ctx)
	r.cancel, r.done = cancel, make(chan struct{})
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer close(r.done)
		g.loop(ctx, r)
	}()
}

// loop runs a member, and again after a backoff when it fails, until ctx
// ends.
func (g *Group) loop(ctx context.Context, r *running) {
	wait := g.opts.MinBackoff
	for {
		r.set(true, nil)
		started := time.Now()
		err := r.m.Run(ctx)
		if ctx.Err() != nil {
			r.set(false, nil)
			return
		}
		if err == nil {
			err = errors.New("Run returned before its context ended")
		}
		if time.Since(started) > g.opts.MaxBackoff {
			wait = g.opts.MinBackoff // it ran a good while: a new failure
		}
		r.set(false, err)
		g.log.Error("txoutbox: relaygroup: member stopped; starting it again after a backoff", "member", r.m.Name, "error", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, g.opts.MaxBackoff)
		r.mu.Lock()
		r.restarts++
		r.mu.Unlock()
		g.log.Info("txoutbox: relaygroup: starting member again", "member", r.m.Name)
	}
}

func (r *running) set(up bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.up = up
	if err != nil {
		r.lastErr = err.Error()
	}
}

// Status returns the members' states, by name.
func (g *Group) Status() []Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Status, 0, len(g.members))
	for name, r := range g.members {
		r.mu.Lock()
		out = append(out, Status{Name: name, Running: r.up, Restarts: r.restarts, LastError: r.lastErr})
		r.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b Status) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}
