#!/usr/bin/env bash
# Runs govulncheck on the module against the Go vulnerability database. The
# database's server (vuln.go.dev) cannot be reached from these machines, so
# the database comes as the golang.org/x/vulndb module from the Go module
# proxy, whose data/osv directory govulncheck reads directly. Fails on a
# vulnerability the code calls in a module of go.mod; reports those of the
# standard library (see internal/testkit/cmd/vulngate).
#
# The scan level is the first argument: symbol (the default: the call
# graph, a minute or two of CPU) or package (imports only, a second, and
# then every vulnerable package imported from a module fails, called or
# not). make test scans packages, make test-long symbols.
set -euo pipefail
LEVEL=${1:-symbol}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VULNDB=golang.org/x/vulndb@v0.0.0-20261105234957-e22db6528018
GOVULNCHECK=golang.org/x/vuln/cmd/govulncheck@v1.9.0
# shellcheck source=retry.sh
. scripts/retry.sh
download() { (cd /tmp && GOFLAGS=-mod=mod go mod download -json "$VULNDB") >"$1"; }
meta=$(mktemp)
retry download "$meta" || true
dir=$(sed -n 's/.*"Dir": "\(.*\)",/\1/p' "$meta")
rm -f "$meta"
if [ -z "$dir" ] || [ ! -d "$dir/data/osv" ]; then
	echo "vulncheck: the vulnerability database $VULNDB is not available from the module proxy" >&2
	exit 1
fi
echo "vulncheck: database $VULNDB ($(ls "$dir/data/osv" | wc -l) entries)" >&2
out=$(mktemp)
bin=$(mktemp -d)
trap 'rm -rf "$out" "$bin"' EXIT
retry env GOFLAGS= GOBIN="$bin" go install "$GOVULNCHECK"
# govulncheck type-checks the module from compiled export data; with -race,
# the build make test's go vet and go test share (and its build tags,
# scripts/test.sh), instead of one more compilation of everything.
GOFLAGS="-race${GOFLAGS:+ $GOFLAGS}" "$bin/govulncheck" -db "file://$dir/data/osv" -scan "$LEVEL" -format json ./... >"$out"
GOFLAGS= go run ./internal/testkit/cmd/vulngate <"$out"
