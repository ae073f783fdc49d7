# Sourced by the scripts that fetch from the Go module proxy.
# retry runs a command up to five times, 5, 10, 20 and 40 s apart: a TLS
# handshake that times out once is the network's hiccup, not a finding.
retry() {
	local wait=5 n
	for n in 1 2 3 4 5; do
		if "$@"; then
			return 0
		fi
		[ "$n" -eq 5 ] && break
		echo "retry: $* failed (attempt $n of 5), again in ${wait}s" >&2
		sleep "$wait"
		wait=$((wait * 2))
	done
	return 1
}
