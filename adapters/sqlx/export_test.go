package sqlxoutbox

// NativeClaims reports whether o claims on pgx's own connections.
func NativeClaims(o *Outbox) bool { return o.native }
