// Package archive moves published events out of the outbox into object
// storage, and publishes them again from there.
//
// An Archiver writes the events published more than a retention ago to a
// gocloud.dev/blob bucket (file://, s3://, gs://, azblob://: import the
// driver as gocloud.dev/blob says), as gzip-compressed JSON Lines, one
// object per day of creation and batch, each with a manifest: the count,
// the Seq and time ranges, and checksums. Rows are deleted only after their
// object and manifest were written, read back and checked, so a process
// killed at any point loses nothing: the next run finds the objects it
// already wrote and deletes their rows, or writes them again under the same
// name. Object names derive from the events they hold, so a batch written
// twice is one object, and objects whose Seq ranges overlap (a batch that
// changed between two runs) hold the same event at most twice, which
// Reader drops.
//
// An Archiver is a core.Cleaner: core.RunCleanup with an Archiver archives
// and deletes in bounded batches on a schedule. Several processes may run
// one: a lock in the database lets one archive at a time.
//
// Reader reads the archive back: the manifests, a count, and the events
// matching a Filter in Seq order. Replay publishes them through any
// core.Publisher with their original IDs, so that consumers' inboxes absorb
// what they already processed.
package archive
