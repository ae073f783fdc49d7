#!/usr/bin/env bash
# The project's test command (`make test`): installs and starts every real
# service the tests need, then runs gofmt, go vet and the race-enabled tests,
# and prints the ten slowest tests.
# Extra arguments go to `go test` (e.g. scripts/test.sh -run TestRelay ./core/).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
start=$(date +%s)
stage() { echo "test.sh: $1 ($(($(date +%s) - start))s)" >&2; }

# Before anything slow: no binary or file over 1 MB is tracked.
scripts/check-tree.sh
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:" >&2
	echo "$unformatted" >&2
	exit 1
fi

# go vet compiles every package with -race, as go test will: one build of
# the module and its dependencies serves both (a plain go vet would compile
# everything a second time). It runs while the services install and start,
# which mostly wait on apt and on the servers.
mkdir -p .services
go vet -race ./... >.services/vet.log 2>&1 &
vet=$!
scripts/services.sh start
stage "services up"
# shellcheck disable=SC1091
. .services/env
if ! wait "$vet"; then
	cat .services/vet.log >&2
	echo "test.sh: go vet failed" >&2
	exit 1
fi
stage "go vet done"

if [ $# -gt 0 ]; then
	exec go test -race -count=1 -timeout 20m "$@"
fi
scripts/vulncheck.sh
stage "vulncheck done"

# Tests named *Outage* take a shared broker down, so they run after the rest,
# one package at a time, and only in the packages that have them.
report=.services/test.json
set +e
go test -race -count=1 -timeout 20m -json -skip 'Outage' ./... >"$report" 2>&1
go run ./internal/cmd/testreport -top 0 <"$report"
main=$?
stage "tests done"
outage=$(git grep -l '^func Test[A-Za-z]*Outage' -- '*_test.go' | xargs -n1 dirname | sort -u | sed 's|^|./|')
# shellcheck disable=SC2086
go test -race -count=1 -timeout 15m -p 1 -json -run 'Outage' $outage >.services/test-outage.json 2>&1
go run ./internal/cmd/testreport -top 0 <.services/test-outage.json
outages=$?
cat "$report" .services/test-outage.json | go run ./internal/cmd/testreport -top 10 | sed -n '/^The [0-9]* slowest/,$p'

set -e
stage "outage tests done"
if [ "$main" -ne 0 ] || [ "$outages" -ne 0 ]; then
	echo "test.sh: tests failed" >&2
	exit 1
fi
