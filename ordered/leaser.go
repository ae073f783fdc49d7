package ordered

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/dialect"
)

// Defaults of LeaserOptions.
const (
	// DefaultLeaseTTL is how long a lease lasts unless renewed: the bound
	// on how long a dead relay's partitions wait for a successor.
	DefaultLeaseTTL = 10 * time.Second
)

// LeaserOptions configures a Leaser.
type LeaserOptions struct {
	// Table is the outbox table whose partitions are leased. Default
	// dialect.DefaultTable.
	Table string
	// Owner identifies this relay; it must be unique among the live
	// relays. Default: host name, process id and a random suffix.
	Owner string
	// PartitionCount is the number of partitions; every relay of the table
	// must use the same. Default core.DefaultPartitionCount.
	PartitionCount int
	// LeaseTTL is how long leases and the heartbeat last unless renewed.
	// A dead relay's partitions are taken over within LeaseTTL +
	// RenewInterval. Default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// RenewInterval is how often leases are renewed and rebalanced; it must
	// be below LeaseTTL. Default LeaseTTL / 3.
	RenewInterval time.Duration
	// OnChange, if set, is called (from Run's goroutine) for every
	// partition acquired, released or lost.
	OnChange func(LeaseChange)
	// Logger receives lease logs. Default slog.Default().
	Logger *slog.Logger
}

// LeaseChangeKind says what happened to a lease.
type LeaseChangeKind int

const (
	// Acquired: the partition was free, or its lease had expired.
	Acquired LeaseChangeKind = iota + 1
	// Released: given up to rebalance or at shutdown.
	Released
	// Lost: the lease was not renewed in time and another relay took it.
	Lost
)

// String returns "acquired", "released" or "lost".
func (k LeaseChangeKind) String() string {
	switch k {
	case Acquired:
		return "acquired"
	case Released:
		return "released"
	case Lost:
		return "lost"
	}
	return fmt.Sprintf("LeaseChangeKind(%d)", int(k))
}

// LeaseChange is one change of a lease this relay held or holds.
type LeaseChange struct {
	Kind      LeaseChangeKind
	Partition int
	// From is the previous owner of an Acquired partition whose lease had
	// expired ("" when it was free): a failover when it is another relay.
	From string
}

// LeaserStats are running totals of a Leaser.
type LeaserStats struct {
	Acquired  int64 // leases acquired
	Takeovers int64 // of them, expired leases of other relays (failovers)
	Released  int64 // leases given up
	Lost      int64 // leases found taken by another relay
}

// Leaser is a core.PartitionLeaser on PostgreSQL. Each Tick (every
// RenewInterval while Run runs) heartbeats, renews the leases held,
// computes the fair share ceil(partitions / live relays) and releases the
// excess or takes free and expired partitions up to it.
//
// The leases decide which relay works on which partitions; they are not
// what makes ordering safe while a lease changes hands (a relay can stall
// past its lease with a batch in flight): the Store's per-partition
// advisory locks are.
type Leaser struct {
	db     *sql.DB
	d      dialect.Dialect
	leases dialect.Identifier // the lease table, for errors
	lq     *dialect.LeaseQueries
	opts   LeaserOptions
	log    *slog.Logger

	mu        sync.Mutex
	held      []int
	renewedAt time.Time // monotonic: when held was last confirmed

	acquired, takeovers, released, lost atomic.Int64
}

// NewLeaser returns a Leaser of the partitions of opts.Table on db.
// Partitions live in the lease tables that dialect.Migrate creates.
func NewLeaser(db *sql.DB, d dialect.Dialect, opts LeaserOptions) (*Leaser, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", core.ErrInvalidOptions)
	}
	if opts.PartitionCount < 0 || opts.LeaseTTL < 0 || opts.RenewInterval < 0 {
		return nil, fmt.Errorf("%w: negative PartitionCount, LeaseTTL or RenewInterval", core.ErrInvalidOptions)
	}
	if opts.PartitionCount == 0 {
		opts.PartitionCount = core.DefaultPartitionCount
	}
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.RenewInterval == 0 {
		opts.RenewInterval = opts.LeaseTTL / 3
	}
	if opts.RenewInterval >= opts.LeaseTTL {
		return nil, fmt.Errorf("%w: RenewInterval %v is not below LeaseTTL %v", core.ErrInvalidOptions, opts.RenewInterval, opts.LeaseTTL)
	}
	if opts.Owner == "" {
		opts.Owner = defaultOwner()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	q, err := d.Queries(opts.Table)
	if err != nil {
		return nil, err
	}
	lq, err := q.Leases()
	if err != nil {
		return nil, err
	}
	leases := dialect.Identifier{Schema: q.Table().Schema, Name: dialect.DefaultLeaseTable}
	return &Leaser{db: db, d: d, leases: leases, lq: lq, opts: opts, log: opts.Logger.With("owner", opts.Owner)}, nil
}

func defaultOwner() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// Owner implements core.PartitionLeaser.
func (l *Leaser) Owner() string { return l.opts.Owner }

// PartitionCount implements core.PartitionLeaser.
func (l *Leaser) PartitionCount() int { return l.opts.PartitionCount }

// Options returns the options with defaults applied.
func (l *Leaser) Options() LeaserOptions { return l.opts }

// Held implements core.PartitionLeaser. Once the leases could not be
// renewed for LeaseTTL, it returns none: other relays may have them.
func (l *Leaser) Held() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if time.Since(l.renewedAt) >= l.opts.LeaseTTL {
		return nil
	}
	return slices.Clone(l.held)
}

// Stats returns the running totals.
func (l *Leaser) Stats() LeaserStats {
	return LeaserStats{Acquired: l.acquired.Load(), Takeovers: l.takeovers.Load(), Released: l.released.Load(), Lost: l.lost.Load()}
}

// Init creates the group's partition rows if this is its first relay, and
// fails with an error wrapping core.ErrPartitionCountMismatch if they exist
// with another count. Run calls it.
func (l *Leaser) Init(ctx context.Context) error {
	n, err := l.count(ctx)
	if err != nil {
		return err
	}
	if n == 0 {
		query, args := l.lq.CreatePartitions(l.opts.PartitionCount)
		if _, err := l.db.ExecContext(ctx, query, args...); err != nil {
			return fmt.Errorf("ordered: create partitions: %w", err)
		}
		// Another relay may have created them at the same moment.
		if n, err = l.count(ctx); err != nil {
			return err
		}
	}
	if n != l.opts.PartitionCount {
		return fmt.Errorf("ordered: %s has %d partitions, this relay wants %d: %w",
			l.lq.Group(), n, l.opts.PartitionCount, core.ErrPartitionCountMismatch)
	}
	return nil
}

func (l *Leaser) count(ctx context.Context) (int, error) {
	query, args := l.lq.PartitionCount()
	var n int
	if err := l.db.QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("ordered: count partitions: %w", err)
	}
	return n, nil
}

// Run implements core.PartitionLeaser: Init, then Tick every RenewInterval
// until ctx ends; then it releases every lease and the heartbeat, so that
// the other relays take over at once.
func (l *Leaser) Run(ctx context.Context) error {
	// Init fails for good on a missing lease table or another partition
	// count; any other failure (the database down) is waited out.
	for wait, logged := 100*time.Millisecond, false; ; wait = min(2*wait, l.opts.RenewInterval) {
		err := l.Init(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if err = dialect.CheckMigrated(err, l.leases); errors.Is(err, core.ErrNotMigrated) || errors.Is(err, core.ErrPartitionCountMismatch) {
			return err
		}
		if !logged {
			l.log.Warn("ordered: cannot read the partitions yet; retrying until the database answers", "error", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	t := time.NewTicker(l.opts.RenewInterval)
	defer t.Stop()
	for {
		if err := l.Tick(ctx); err != nil && ctx.Err() == nil {
			l.log.Warn("ordered: lease renewal failed", "error", err)
		}
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := l.Leave(sctx); err != nil {
				l.log.Warn("ordered: releasing leases at shutdown failed; they will expire", "error", err)
			}
			return nil
		case <-t.C:
		}
	}
}

// Tick heartbeats, renews and rebalances once. Run calls it; tests call it
// to step relays deterministically.
func (l *Leaser) Tick(ctx context.Context) error {
	ttl := l.opts.LeaseTTL
	start := time.Now()
	query, args := l.lq.Heartbeat(l.opts.Owner, ttl)
	if _, err := l.db.ExecContext(ctx, query, args...); err != nil {
		return fmt.Errorf("ordered: heartbeat: %w", err)
	}
	query, args = l.lq.LiveRelays()
	var live int
	if err := l.db.QueryRowContext(ctx, query, args...).Scan(&live); err != nil {
		return fmt.Errorf("ordered: count live relays: %w", err)
	}
	held, err := l.renew(ctx, ttl)
	if err != nil {
		return fmt.Errorf("ordered: renew leases: %w", err)
	}
	slices.Sort(held)
	l.mu.Lock()
	before := slices.Clone(l.held)
	l.mu.Unlock()
	for _, p := range before {
		if !slices.Contains(held, p) {
			l.lost.Add(1)
			l.log.Warn("ordered: lease lost to another relay", "partition", p)
			l.change(LeaseChange{Kind: Lost, Partition: p})
		}
	}
	l.setHeld(held, start)

	n := l.opts.PartitionCount
	share := (n + max(live, 1) - 1) / max(live, 1)
	switch {
	case len(held) > share:
		excess := slices.Clone(held[share:])
		query, args := l.lq.Release(l.opts.Owner, excess)
		// Stop claiming them before they go: the store's locks make an
		// overlap safe, but there is no point in one.
		l.setHeld(held[:share], start)
		if _, err := l.db.ExecContext(ctx, query, args...); err != nil {
			return fmt.Errorf("ordered: release %d leases: %w", len(excess), err)
		}
		l.released.Add(int64(len(excess)))
		l.log.Info("ordered: released leases to rebalance", "partitions", excess, "live_relays", live, "share", share)
		for _, p := range excess {
			l.change(LeaseChange{Kind: Released, Partition: p})
		}
	case len(held) < share:
		got, err := l.acquire(ctx, share-len(held))
		if err != nil {
			return err
		}
		if len(got) > 0 {
			held = append(held, got...)
			slices.Sort(held)
			l.setHeld(held, start)
		}
	}
	query, args = l.lq.PruneRelays(10 * ttl)
	if _, err := l.db.ExecContext(ctx, query, args...); err != nil {
		return fmt.Errorf("ordered: prune heartbeats: %w", err)
	}
	return nil
}

// renew extends owner's leases and returns the partitions it holds: one
// statement with RETURNING, or the UPDATE and then a read.
func (l *Leaser) renew(ctx context.Context, ttl time.Duration) ([]int, error) {
	query, args := l.lq.Renew(l.opts.Owner, ttl)
	if l.lq.Returning() {
		return l.queryPartitions(ctx, query, args)
	}
	if _, err := l.db.ExecContext(ctx, query, args...); err != nil {
		return nil, err
	}
	query, args = l.lq.Held(l.opts.Owner)
	return l.queryPartitions(ctx, query, args)
}

func (l *Leaser) acquire(ctx context.Context, k int) ([]int, error) {
	changes, err := l.acquireRows(ctx, k)
	if err != nil {
		return nil, fmt.Errorf("ordered: acquire leases: %w", err)
	}
	var got []int
	for _, c := range changes {
		got = append(got, c.Partition)
	}
	for _, c := range changes {
		l.acquired.Add(1)
		if c.From != "" && c.From != l.opts.Owner {
			l.takeovers.Add(1)
			l.log.Info("ordered: took over an expired lease", "partition", c.Partition, "from", c.From)
		}
		l.change(c)
	}
	return got, nil
}

// acquireRows leases up to k free or expired partitions and returns them
// with their previous owners: one statement with RETURNING, or a locking
// read and an UPDATE in one transaction.
func (l *Leaser) acquireRows(ctx context.Context, k int) ([]LeaseChange, error) {
	scan := func(rows *sql.Rows) ([]LeaseChange, error) {
		defer rows.Close()
		var changes []LeaseChange
		for rows.Next() {
			c := LeaseChange{Kind: Acquired}
			if err := rows.Scan(&c.Partition, &c.From); err != nil {
				return nil, err
			}
			changes = append(changes, c)
		}
		return changes, errors.Join(rows.Err(), rows.Close())
	}
	if l.lq.Returning() {
		query, args := l.lq.Acquire(l.opts.Owner, l.opts.LeaseTTL, k)
		rows, err := l.db.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		return scan(rows)
	}
	tx, err := l.db.BeginTx(ctx, l.d.ClaimTxOptions())
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	query, args := l.lq.AcquireCandidates(k)
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	changes, err := scan(rows)
	if err != nil || len(changes) == 0 {
		return nil, err
	}
	parts := make([]int, len(changes))
	for i, c := range changes {
		parts[i] = c.Partition
	}
	query, args = l.lq.AcquireMark(l.opts.Owner, l.opts.LeaseTTL, parts)
	if _, err := tx.ExecContext(ctx, query, args...); err != nil {
		return nil, err
	}
	return changes, tx.Commit()
}

func (l *Leaser) queryPartitions(ctx context.Context, query string, args []any) ([]int, error) {
	rows, err := l.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ps []int
	for rows.Next() {
		var p int
		if err := rows.Scan(&p); err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, errors.Join(rows.Err(), rows.Close())
}

func (l *Leaser) setHeld(held []int, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held = slices.Clone(held)
	l.renewedAt = at
}

func (l *Leaser) change(c LeaseChange) {
	if l.opts.OnChange != nil {
		l.opts.OnChange(c)
	}
}

// Leave releases every lease and the heartbeat. Run calls it at shutdown.
func (l *Leaser) Leave(ctx context.Context) error {
	l.mu.Lock()
	held := l.held
	l.held = nil
	l.mu.Unlock()
	query, args := l.lq.Release(l.opts.Owner, nil)
	if _, err := l.db.ExecContext(ctx, query, args...); err != nil {
		return fmt.Errorf("ordered: release leases: %w", err)
	}
	l.released.Add(int64(len(held)))
	for _, p := range held {
		l.change(LeaseChange{Kind: Released, Partition: p})
	}
	query, args = l.lq.Leave(l.opts.Owner)
	if _, err := l.db.ExecContext(ctx, query, args...); err != nil {
		return fmt.Errorf("ordered: remove heartbeat: %w", err)
	}
	return nil
}

// Lease is one partition's lease, as Leases reports it.
type Lease struct {
	Partition int
	// Owner is "" for a free partition.
	Owner string
	// Live is false for a free or expired lease.
	Live bool
}

// Leases returns every partition's lease of the table, for operators and
// tests.
func (l *Leaser) Leases(ctx context.Context) ([]Lease, error) {
	query, args := l.lq.List()
	rows, err := l.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("ordered: list leases: %w", err)
	}
	defer rows.Close()
	var out []Lease
	for rows.Next() {
		var le Lease
		if err := rows.Scan(&le.Partition, &le.Owner, &le.Live); err != nil {
			return nil, fmt.Errorf("ordered: list leases: %w", err)
		}
		out = append(out, le)
	}
	return out, errors.Join(rows.Err(), rows.Close())
}
