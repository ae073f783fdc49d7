package console

// GroupKey is the key of a dead-letter group, for tests that post a form
// the way the console's pages do.
var GroupKey = groupKey
