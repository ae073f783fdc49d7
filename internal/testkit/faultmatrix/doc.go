// Package faultmatrix holds the fault matrix: the whole chain (producers,
// relay, broker, inbox consumer) under each fault that package faultproxy
// and the test services can inject, for each broker and ordering mode. It
// has only tests; see docs/reliability.md.
package faultmatrix
