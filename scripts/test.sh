#!/usr/bin/env bash
# The project's test command (`make test`): installs and starts every real
# service the tests need, then runs gofmt, go vet and the race-enabled tests,
# and prints the ten slowest tests and packages.
# Extra arguments go to `go test` (e.g. scripts/test.sh -run TestRelay ./core/).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
start=$(date +%s)
stage() { echo "test.sh: $1 ($(($(date +%s) - start))s)" >&2; }
# cputime runs a command and writes the CPU it and its children used to
# .services/NAME.cpu ("user sys" in seconds), for the report at the end.
cputime() {
	local name=$1
	shift
	local rc=0
	"$@" || rc=$?
	# times in this shell, not in a pipe's subshell: its second line is
	# the CPU of the children the shell waited for.
	times >".services/$name.times"
	tail -1 ".services/$name.times" >".services/$name.cpu"
	return $rc
}

# Before anything slow: no binary or file over 1 MB is tracked.
scripts/check-tree.sh
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:" >&2
	echo "$unformatted" >&2
	exit 1
fi

# Every package, test variant and dependency is compiled with -race (go
# list -export compiles without linking or vetting) while the services
# install and start, which mostly wait on apt and on the servers: the
# tests, go vet, govulncheck and the programs the tests build then reuse
# that one compilation.
mkdir -p .services
# gorm.io/driver/sqlite's cgo driver (github.com/mattn/go-sqlite3, in the
# GORM tests and examples) compiles SQLite's C amalgamation, 35 s of CPU on
# a cold cache; with its libsqlite3 tag it links the system's SQLite
# instead. Every go command below (and the programs the tests build) sees
# the tag through GOFLAGS, so they share one compilation.
if [ -f /usr/include/sqlite3.h ]; then
	export GOFLAGS="-tags=libsqlite3${GOFLAGS:+ $GOFLAGS}"
fi
# The modules first, with retries (scripts/retry.sh): the compile below
# would fail on the proxy's first dropped connection.
# shellcheck source=retry.sh
. scripts/retry.sh
retry go mod download
# The servers (services.sh's and those tests start of their own) write
# without flushing each commit to disk: every crash of the tests kills a
# server process, not the machine, and the page cache keeps what a killed
# server wrote, so no outcome changes; a busy run's commits stop queueing
# for the disk. make bench keeps them durable (services.sh).
export TXOUTBOX_FSYNC=${TXOUTBOX_FSYNC:-off}
# PostgreSQL's autovacuum visits each test database every 10 minutes, not
# every minute (services.sh says why).
export TXOUTBOX_PG_AUTOVACUUM_NAPTIME=${TXOUTBOX_PG_AUTOVACUUM_NAPTIME:-10min}
# The compiler and go vet collect garbage less often (GOGC=400): 8 % less
# CPU for the module's compilation, measured on a cold cache, for some
# hundred MB more per process. The tests keep the default.
GOGC=400 bash -c "$(declare -f cputime); cputime build go list -race -export -test -deps ./..." >/dev/null 2>.services/build.log &
build=$!
if [ -n "${TXOUTBOX_SERVICES_ENV:-}" ]; then
	# Services already running elsewhere (another checkout's): reuse them.
	# shellcheck disable=SC1090
	. "$TXOUTBOX_SERVICES_ENV"
else
	scripts/services.sh start
	# shellcheck disable=SC1091
	. .services/env
fi
stage "services up"
if ! wait "$build"; then
	cat .services/build.log >&2
	echo "test.sh: the module does not compile" >&2
	exit 1
fi
stage "module compiled"

# go vet (below, or beside the tests) runs every analyzer, a superset of
# go test's own vet pass (-vet=off), which would otherwise analyse every
# dependency a second time (about 100 s of CPU on a cold cache). Test
# binaries are linked without DWARF and symbol table (-ldflags='-s -w':
# half the link CPU of the default, 10.3 s to 5.0 s for cmd/txoutbox's;
# panics and race reports still print their stacks, from the Go runtime's
# own tables).
gotest=(go test -race -count=1 -vet=off "-ldflags=-s -w")
# A program built with -race sleeps a second at exit (ThreadSanitizer's
# atexit_sleep_ms) for goroutines still running to report races; the
# tests run thousands of such programs (every test binary, the CLI and
# the fault matrix's relay and consumer processes), which stop their
# goroutines before they exit.
export GORACE="atexit_sleep_ms=0${GORACE:+ $GORACE}"

# The long tier (make test-long): every test at its long size.
timeout=20m
if [ "${TXOUTBOX_LONG:-}" = 1 ]; then
	timeout=300m
fi

if [ $# -gt 0 ]; then
	go vet -race ./...
	exec "${gotest[@]}" -timeout "$timeout" "$@"
fi

# Every test binary runs under cpuexec, which logs the CPU time it and the
# processes it ran used: on this saturated machine a package's wall time
# says little, its CPU time says what it costs the others.
go build -o .services/bin/cpuexec ./internal/testkit/cmd/cpuexec
# Built once, for the four reports at the end (go run links it each time).
go build -o .services/bin/testreport ./internal/testkit/cmd/testreport
rm -f .services/cpu.log
export TXOUTBOX_CPU_LOG="$ROOT/.services/cpu.log"
cpuexec=(-exec "$ROOT/.services/bin/cpuexec")

# Two lanes run beside each other: the fault matrix
# (internal/testkit/faultmatrix, the longest package, mostly waiting) and
# the other packages. The tests named TestOutage*, which stop the RabbitMQ
# server, then run one package at a time against a second RabbitMQ node
# (services.sh) that no other test uses, in whichever lane finishes first
# (run as a third lane from the start, they made the whole run slower: a
# RabbitMQ node that restarts on a saturated machine restarts slowly). A
# test that stops a server of its own (Kafka's kfake, the SNS tests' front)
# is not named so and runs with the others. go vet and govulncheck run
# beside them at the lowest CPU priority. The waits of the tests judge
# progress, not a deadline (internal/testkit/wait), so a loaded machine
# makes them slower, not red.
#
# go test starts packages in the order it is given them, two at a time: the
# longest come first (the durations of a clean run's test.json; testreport
# prints them), so that no long package starts last and runs alone. A
# package missing from the list runs after them, in go list's order; a
# name of the list that is no package (renamed, removed) is passed over.
long_first=(cmd/txoutbox adapters/sqlx testing adapters/gorm bench internal/testkit/pgbouncertest adapters/pgx inbox/sqlinbox archive inbox/gorminbox logrelay)
module=$(go list -m)
all=$(go list ./... | grep -v '/internal/testkit/faultmatrix$')
pkgs=()
for p in "${long_first[@]}"; do
	if grep -qx "$module/$p" <<<"$all"; then
		pkgs+=("$module/$p")
	fi
done
for p in $all; do
	case " ${pkgs[*]} " in *" $p "*) ;; *) pkgs+=("$p") ;; esac
done
lanes=${TXOUTBOX_TEST_P:-3}
parallel=${TXOUTBOX_TEST_PARALLEL:-4}
matrix_parallel=${TXOUTBOX_MATRIX_PARALLEL:-3}
outage=$(git grep -l '^func TestOutage' -- '*_test.go' | xargs -n1 dirname | sort -u | sed 's|^|./|')
# The outage tests run as two chains at once, each against a RabbitMQ node
# of its own: ordered's chaos tests (the longest) on one, the others one
# package at a time on the other.
outage_a=$(grep -vx './ordered' <<<"$outage" || true)
outage_b=$(grep -x './ordered' <<<"$outage" || true)
rm -rf .services/outage.claim .services/test-outage.json .services/test-outage2.json
outage_chain() { # outage_chain NODE_PREFIX OUTPUT PACKAGES...
	local node=$1 out=$2
	shift 2
	[ $# -gt 0 ] || return 0
	local url=TXOUTBOX_${node}_AMQP_URL ctl=TXOUTBOX_${node}_RABBITMQCTL env=TXOUTBOX_${node}_RABBITMQ_ENV
	TXOUTBOX_AMQP_URL=${!url} TXOUTBOX_RABBITMQCTL=${!ctl} TXOUTBOX_RABBITMQ_ENV=${!env} \
		"${gotest[@]}" -timeout "$timeout" -p 1 "${cpuexec[@]}" -json -run '^TestOutage' "$@" >"$out" 2>&1 || true
}
outage_tests() {
	# mkdir is atomic: the first lane to finish claims the outage tests.
	mkdir .services/outage.claim 2>/dev/null || return 0
	# shellcheck disable=SC2086
	outage_chain OUTAGE .services/test-outage.json $outage_a &
	# shellcheck disable=SC2086
	outage_chain OUTAGE2 .services/test-outage2.json $outage_b
	wait
	stage "outage tests done"
}
(
	"${gotest[@]}" -timeout "$timeout" -p "$lanes" -parallel "$parallel" "${cpuexec[@]}" -json -skip '^TestOutage' "${pkgs[@]}" >.services/test.json 2>&1 || true
	stage "other tests done"
	outage_tests
) &
main=$!
(
	"${gotest[@]}" -timeout "$timeout" -parallel "$matrix_parallel" "${cpuexec[@]}" -json -skip '^TestOutage' ./internal/testkit/faultmatrix >.services/test-faults.json 2>&1 || true
	stage "fault matrix done"
	outage_tests
) &
faults=$!
# govulncheck's call graph costs a minute or two of CPU the tests need;
# make test checks imports (stricter: a vulnerable package imported from a
# module fails, called or not), make test-long what is called.
vulnlevel=package
if [ "${TXOUTBOX_LONG:-}" = 1 ]; then
	vulnlevel=symbol
fi
nice -n 19 bash -c "$(declare -f cputime); cputime vulncheck scripts/vulncheck.sh $vulnlevel" >.services/vulncheck.log 2>&1 &
vuln=$!
# go vet analyses the module (and, for its facts, every dependency) at the
# lowest priority too: it needs CPU the tests leave idle, not their time.
GOGC=400 nice -n 19 bash -c "$(declare -f cputime); cputime vet go vet -race ./..." >.services/vet.log 2>&1 &
vet=$!
wait "$main" || true
wait "$faults" || true
# testing/sqlfixture drops the tests' PostgreSQL databases in batches a few
# seconds after their tests end (each DROP DATABASE waits for a checkpoint,
# which drops that wait together share); a test binary that exits first
# leaves its last batch. Every test is over now: drop what is left.
# Beside the reports: about 40 drops, 11 s in a clean run.
(
	psql "$TXOUTBOX_PG_DSN" -Atc "SELECT datname FROM pg_database WHERE datname ~ '^t_[0-9a-f]+_[0-9a-f]{12}$'" |
		xargs -r -P 8 -I{} psql "$TXOUTBOX_PG_DSN" -qc 'DROP DATABASE IF EXISTS "{}" WITH (FORCE)' || true
) &
leftovers=$!
failed=0
touch .services/test-outage.json .services/test-outage2.json
for r in .services/test.json .services/test-faults.json .services/test-outage.json .services/test-outage2.json; do
	.services/bin/testreport -top 0 <"$r" || failed=1
done
cat .services/test.json .services/test-faults.json .services/test-outage.json .services/test-outage2.json | .services/bin/testreport -top 10 | sed -n "/^The [0-9]* slowest tests/,\$p" || true
.services/bin/cpuexec -report 10 <.services/cpu.log || true
# The servers' CPU (their own and that of the children they reaped:
# PostgreSQL's backends), which the tests' figures above leave out.
echo "CPU of the servers (user+sys, children included):"
hz=$(getconf CLK_TCK)
for name in postgres mariadbd beam.smp nats-server goaws-v0.4.5 gofakes3-v1.2.0 pgbouncer; do
	total=0
	for pid in $(pgrep -x "$name" 2>/dev/null || true); do
		# Fields 14-17 of /proc/PID/stat: utime, stime, cutime, cstime.
		t=$(awk '{sub(/^.*\) /, ""); print $12 + $13 + $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
		total=$((total + t))
	done
	if [ "$total" -gt 0 ]; then
		awk -v t="$total" -v hz="$hz" -v n="$name" 'BEGIN { printf "    %6.1fs  %s\n", t / hz, n }'
	fi
done
if [ -f "${TXOUTBOX_PGBOUNCER_GATE_LOG:-}" ]; then
	echo "test.sh: the shared PgBouncer's gate kept $(grep -c 'dropped a cancel request' "$TXOUTBOX_PGBOUNCER_GATE_LOG") cancel requests from it (pgbouncer#822 in 1.18, see internal/testkit/cancelgate)" >&2
fi
if [ -s "${TXOUTBOX_PGBOUNCER_RESTARTS:-}" ]; then
	echo "test.sh: the shared PgBouncer exited and services.sh's supervisor started it again (its gate keeps pgbouncer#822's cancel requests from it, so look at its last FATAL; see scripts/services.sh):" >&2
	cat "$TXOUTBOX_PGBOUNCER_RESTARTS" >&2
fi
wait "$leftovers" || true
if ! wait "$vuln"; then
	failed=1
fi
cat .services/vulncheck.log >&2
if ! wait "$vet"; then
	cat .services/vet.log >&2
	echo "test.sh: go vet failed" >&2
	failed=1
fi
for step in build vet vulncheck; do
	if [ -f ".services/$step.cpu" ]; then
		echo "CPU of $step (user, sys): $(cat ".services/$step.cpu")"
	fi
done
stage "done"
if [ "$failed" -ne 0 ]; then
	echo "test.sh: failed" >&2
	exit 1
fi
