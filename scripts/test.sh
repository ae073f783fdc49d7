#!/usr/bin/env bash
# The project's test command (`make test`): installs and starts every real
# service the tests need, then runs gofmt, go vet and the race-enabled tests.
# Extra arguments go to `go test` (e.g. scripts/test.sh -run TestRelay ./core/).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

# Before anything slow: no binary or file over 1 MB is tracked.
scripts/check-tree.sh
scripts/services.sh start
# shellcheck disable=SC1091
. .services/env

unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:" >&2
	echo "$unformatted" >&2
	exit 1
fi
go vet ./...
if [ $# -gt 0 ]; then
	exec go test -race -count=1 -timeout 20m "$@"
fi
scripts/vulncheck.sh
# Tests named *Outage* take a shared broker down, so they run after the rest,
# one package at a time.
go test -race -count=1 -timeout 20m -skip 'Outage' ./...
go test -race -count=1 -timeout 15m -p 1 -run 'Outage' ./...
