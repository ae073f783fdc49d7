// Package binlogrelay is log mode on MySQL and MariaDB: the relay reads the
// outbox's events from the server's binary log, as a replica does, instead
// of claiming and marking rows.
//
// Producers keep their code: Enqueue, ExecWithEvents, the GORM plugin and
// hand-written INSERTs write the outbox table as in table mode. Setup gives
// the table's published_at column a default, the time of the insert, so
// that a producer's row is born "handed to the log": the table relay of the
// retry path never claims it, and cleanup deletes it after its retention
// like any published row. The stream publishes each committed insert of
// the table whose published_at is set, in commit order; nothing is written
// per event. Only committed transactions reach the binlog (InnoDB writes a
// transaction there at its commit), so a rolled-back event is never read.
//
// Progress is the binlog position (file and offset) of the last
// transaction whose events the broker accepted, stored in the table
// txoutbox_log_positions at most every Options.ConfirmInterval while events
// flow (20 ms), once a second otherwise, and at once on a graceful stop;
// a relay killed at any point starts again from the stored position, so
// delivery stays at least once, and what is sent again is bounded by that
// interval.
//
// An event the broker refuses goes to the table's retry path: the stream
// sets the row's published_at back to NULL with its attempt, error and
// backoff, and a core.Relay that runs alongside retries it with table
// mode's attempts, backoff and dead letters. In ordered mode the later
// events of its aggregate follow it there, as in package logrelay, whose
// publishing half this package shares.
//
// Several relays may run on one outbox: one streams (it holds the named
// lock GET_LOCK('txoutbox_log:<database>.<name>')), the others stand by
// and take over within StandbyInterval when its session ends.
//
// The server needs log_bin on, binlog_format = ROW and binlog_row_image =
// FULL; the relay's user needs REPLICATION SLAVE and BINLOG MONITOR
// (MariaDB) or REPLICATION CLIENT (MySQL). A binlog file the relay still
// needs that the server purged is detected (ErrBinlogPurged); Recover hands
// the events since the stored position to the table's retry path. See
// docs/mysql.md.
package binlogrelay
