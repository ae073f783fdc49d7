// Package pgbouncertest runs the conformance suites through the PgBouncer
// of make test, in transaction pooling mode, with pgx's
// default_query_exec_mode=exec (PgBouncer 1.18 keeps no prepared statement
// across transactions): the stores (sqlx, pgx, GORM), ordered claims, the
// inboxes, and a service end to end. It has tests only.
package pgbouncertest
