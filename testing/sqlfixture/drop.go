package sqlfixture

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// PostgreSQL's DROP DATABASE waits for an immediate checkpoint: every dirty
// buffer of the server is written and synced, and the next change to each
// page then logs the whole page. Dropped one at a time, as the tests end,
// the databases of a make test run (about 600) forced 644 checkpoints; in
// batches, 337. Drops that wait at the same time share a checkpoint, so a test's database is dropped in a batch, with the
// others of its process that end within dropDelay.
const dropDelay = 5 * time.Second

// staleAfter is the age at which a database of this package that no
// process dropped (its process ended before its batch) is dropped by the
// next process that creates one on the server. Longer than any test run.
const staleAfter = time.Hour

// databaseName is the form of newDatabaseName: t_, the creation time in
// hexadecimal Unix seconds, _, 12 random hexadecimal digits.
var databaseName = regexp.MustCompile(`^t_([0-9a-f]{8,16})_[0-9a-f]{12}$`)

func newDatabaseName(now time.Time) string {
	return "t_" + strconv.FormatInt(now.Unix(), 16) + "_" + randomID()
}

// created returns when a database of newDatabaseName's form was created.
func created(name string) (time.Time, bool) {
	m := databaseName.FindStringSubmatch(name)
	if m == nil {
		return time.Time{}, false
	}
	sec, err := strconv.ParseInt(m[1], 16, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(sec, 0), true
}

// dropper keeps the test databases of one server: it hands reset ones to
// the next tests (reuse.go) and drops the others in batches.
type dropper struct {
	adminDSN string
	swept    sync.Once
	open     sync.Once
	admin    *sql.DB // kept for the process
	openErr  error
	mu       sync.Mutex
	pending  []string
	running  bool
	free     map[string]*time.Timer // reset databases → their expiry
}

// adminDB returns the process's pool on the server's admin DSN.
func (d *dropper) adminDB() (*sql.DB, error) {
	d.open.Do(func() {
		d.admin, d.openErr = sql.Open("pgx", d.adminDSN)
		if d.openErr == nil {
			// Enough for a batch of drops at once; idle ones close, so
			// that a process between tests holds no session.
			d.admin.SetMaxOpenConns(8)
			d.admin.SetMaxIdleConns(2)
			d.admin.SetConnMaxIdleTime(10 * time.Second)
		}
	})
	return d.admin, d.openErr
}

var droppers sync.Map // admin DSN → *dropper

func dropperFor(adminDSN string) *dropper {
	d, _ := droppers.LoadOrStore(adminDSN, &dropper{adminDSN: adminDSN})
	return d.(*dropper)
}

// drop queues name; a batch starts dropDelay after the first name queued.
func (d *dropper) drop(names ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pending = append(d.pending, names...)
	if !d.running && len(d.pending) > 0 {
		d.running = true
		go d.run()
	}
}

func (d *dropper) run() {
	for {
		time.Sleep(dropDelay)
		d.mu.Lock()
		names := d.pending
		d.pending = nil
		if len(names) == 0 {
			d.running = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
		// Errors are left to the sweep: the test that made the database
		// has ended.
		_ = d.dropAll(names)
	}
}

// dropAll drops names on the server, all at once.
func (d *dropper) dropAll(names []string) error {
	db, err := d.adminDB()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The pool's 8 connections bound how many run at once.
	var wg sync.WaitGroup
	errs := make([]error, len(names))
	for i, name := range names {
		wg.Go(func() {
			if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
				errs[i] = fmt.Errorf("drop database %s: %w", name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// sweep queues, once per process, the databases of this package on the
// server older than staleAfter: those whose process ended before their
// batch ran.
func (d *dropper) sweep(ctx context.Context) {
	d.swept.Do(func() {
		admin, err := d.adminDB()
		if err != nil {
			return
		}
		rows, err := admin.QueryContext(ctx, "SELECT datname FROM pg_database WHERE datname LIKE 't\\_%'")
		if err != nil {
			return
		}
		defer rows.Close()
		var stale []string
		for rows.Next() {
			var name string
			if rows.Scan(&name) != nil {
				return
			}
			if at, ok := created(name); ok && time.Since(at) > staleAfter {
				stale = append(stale, name)
			}
		}
		if rows.Err() == nil {
			d.drop(stale...)
		}
	})
}
