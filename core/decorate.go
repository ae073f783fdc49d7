package core

// orderedClaims is the method of OrderedStore beyond Store.
type orderedClaims interface{ OrderedClaims() bool }

// DecorateStore returns outer, a decorator of inner (metrics, tracing),
// together with the optional interfaces of inner that the relay looks for
// by type assertion: ConcurrencyLimiter and OrderedStore. Decorating a store
// through it never changes how the relay runs it (its concurrency cap,
// ordered mode). Interfaces the relay does not look for, such as
// StatsReader, are not forwarded.
func DecorateStore(inner, outer Store) Store {
	l, isL := inner.(ConcurrencyLimiter)
	o, isO := inner.(OrderedStore)
	switch {
	case isL && isO:
		return struct {
			Store
			ConcurrencyLimiter
			orderedClaims
		}{outer, l, o}
	case isL:
		return struct {
			Store
			ConcurrencyLimiter
		}{outer, l}
	case isO:
		return struct {
			Store
			orderedClaims
		}{outer, o}
	}
	return outer
}

// DecoratePublisher returns outer, a decorator of inner, together with
// inner's OrderingPublisher, which the relay's OrderingAuto looks for.
func DecoratePublisher(inner, outer Publisher) Publisher {
	if op, ok := inner.(OrderingPublisher); ok {
		return struct {
			Publisher
			OrderingPublisher
		}{outer, op}
	}
	return outer
}
