#!/usr/bin/env bash
# Installs (from Debian packages) and starts the real services the tests need,
# on loopback, under .services/ in the repository. Prints the environment the
# tests read; source the printed file:  . .services/env
#
#   scripts/services.sh start   # install if missing, start, write .services/env
#   scripts/services.sh stop    # stop everything started here
#
# Services: PostgreSQL 15 (throwaway cluster, durable: the benchmarks run on it), MariaDB
# 10.11 (Debian's mariadb-server, a throwaway datadir, durable too, with its binlog),
# RabbitMQ (Debian's rabbitmq-server, two nodes with their own names and ports: the
# second for the tests that stop the broker), the goaws SNS/SQS
# emulator and the gofakes3 S3 server (each built from its Go module), and
# nats-server with JetStream on disk (Debian's nats-server), and PgBouncer
# (Debian's pgbouncer) in transaction pooling mode in front of PostgreSQL,
# behind a gate that keeps cancel requests from it (internal/testkit/cmd/pgbouncergate).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SVC="$ROOT/.services"
# The default ports lie below Linux's ephemeral range (32768-60999 by
# default), where another process's outgoing connection could hold one for a
# moment. goaws itself listens on SNS_PORT + 1, behind its gate, and
# PgBouncer on PGBOUNCER_PORT + 1, behind its own.
PG_PORT=${TXOUTBOX_PG_PORT:-24432}
AMQP_PORT=${TXOUTBOX_AMQP_PORT:-24672}
AMQP_DIST_PORT=${TXOUTBOX_AMQP_DIST_PORT:-24673}
SNS_PORT=${TXOUTBOX_SNS_PORT:-24100}
MARIADB_PORT=${TXOUTBOX_MARIADB_PORT:-24306}
S3_PORT=${TXOUTBOX_S3_PORT:-24900}
NATS_PORT=${TXOUTBOX_NATS_PORT:-24222}
PGBOUNCER_PORT=${TXOUTBOX_PGBOUNCER_PORT:-24434}
case "${TXOUTBOX_RABBITMQ_NODENAME:-txoutbox}" in
*@*)
	echo "services: TXOUTBOX_RABBITMQ_NODENAME=$TXOUTBOX_RABBITMQ_NODENAME: give the name without @host (@localhost is added)" >&2
	exit 2
	;;
esac
RABBIT_NODE=${TXOUTBOX_RABBITMQ_NODENAME:-txoutbox}@localhost
# Two more RabbitMQ nodes for the tests that stop the broker (TestOutage*):
# make test runs them at the end, two packages at once, each on a node of
# its own, while the other tests keep the first node.
OUTAGE_AMQP_PORT=${TXOUTBOX_OUTAGE_AMQP_PORT:-24682}
OUTAGE_AMQP_DIST_PORT=${TXOUTBOX_OUTAGE_AMQP_DIST_PORT:-24683}
OUTAGE_NODE=${TXOUTBOX_RABBITMQ_NODENAME:-txoutbox}-outage@localhost
OUTAGE2_AMQP_PORT=${TXOUTBOX_OUTAGE2_AMQP_PORT:-24692}
OUTAGE2_AMQP_DIST_PORT=${TXOUTBOX_OUTAGE2_AMQP_DIST_PORT:-24693}
OUTAGE2_NODE=${TXOUTBOX_RABBITMQ_NODENAME:-txoutbox}-outage2@localhost
PGBIN=/usr/lib/postgresql/15/bin
# The cluster lives outside the checkout: the postgres user must reach it,
# and a checkout under /root is closed to that user.
PG_DIR=${TXOUTBOX_PG_DIR:-/tmp/txoutbox-pg-$PG_PORT}

# rabbitmq-server and its CLI read the Erlang cookie from $HOME.
export HOME=${HOME:-/root}

log() { echo "services: $*" >&2; }

# port_free PORT NAME fails with a clear message when something else
# listens on PORT already.
port_free() {
	if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
		log "port $1 for $2 is taken by another process; free it, or set TXOUTBOX_${3}_PORT to another port (below 32768, outside the ephemeral range)"
		return 1
	fi
}

apt_updated=0
need_pkg() { # need_pkg BINARY PACKAGE...
	if [ ! -x "$1" ] && ! command -v "$1" >/dev/null 2>&1; then
		if [ "$apt_updated" = 0 ]; then
			log "apt-get update"
			DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
			apt_updated=1
		fi
		shift
		log "apt-get install $*"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
	fi
}

start_postgres() {
	need_pkg "$PGBIN/initdb" postgresql-15
	local dir="$PG_DIR"
	if [ -f "$dir/data/postmaster.pid" ] && su postgres -s /bin/sh -c "$PGBIN/pg_ctl -D $dir/data status" >/dev/null 2>&1; then
		log "postgres already running on $PG_PORT"
		return
	fi
	port_free "$PG_PORT" postgres PG
	rm -rf "$dir"
	mkdir -p "$dir"
	chown postgres: "$dir"
	su postgres -s /bin/sh -c "$PGBIN/initdb -D $dir/data -U postgres -A trust --no-sync -E UTF8" >"$SVC/pg-initdb.log" 2>&1
	cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$dir'
# Durable, as in production, unless TXOUTBOX_FSYNC=off: \`go run ./bench\`
# measures producers' commits on this server, and with fsync off a commit
# costs nothing, which makes any extra statement look several times dearer
# than it is. make test turns it off (scripts/test.sh): its crashes kill
# server processes, not the machine, and the page cache keeps every write
# a killed server made, so the tests' outcomes do not change, while each
# commit of a busy run stops queueing for the disk.
fsync = ${TXOUTBOX_FSYNC:-on}
synchronous_commit = on
full_page_writes = ${TXOUTBOX_FSYNC:-on}
max_connections = 600
shared_buffers = 256MB
# The autovacuum launcher visits every database once per naptime: with
# make test's hundreds of short-lived test databases, a worker started
# every few hundred milliseconds (28 ms of CPU each, measured: 3.4 % of a
# core with 72 idle databases), for tables that live seconds. make test
# sets 10min (scripts/test.sh); make services keeps the default.
autovacuum_naptime = ${TXOUTBOX_PG_AUTOVACUUM_NAPTIME:-1min}
wal_level = logical
max_wal_senders = 32
max_replication_slots = 32
CONF
	su postgres -s /bin/sh -c "$PGBIN/pg_ctl -D $dir/data -l $dir/log -w -t 60 start" >&2
	log "postgres up on 127.0.0.1:$PG_PORT"
}

start_mariadb() {
	need_pkg /usr/sbin/mariadbd mariadb-server
	local dir="$SVC/mariadb"
	local sock="$dir/mariadbd.sock"
	if [ -f "$dir/mariadbd.pid" ] && kill -0 "$(cat "$dir/mariadbd.pid")" 2>/dev/null; then
		log "mariadb already running on $MARIADB_PORT"
		return
	fi
	port_free "$MARIADB_PORT" mariadb MARIADB
	rm -rf "$dir"
	mkdir -p "$dir"
	# Durable, as PostgreSQL above: every commit waits for its redo log
	# flush (innodb_flush_log_at_trx_commit = 1, the default), so that the
	# benchmark's producer figures mean what they would in production;
	# with TXOUTBOX_FSYNC=off (make test) a commit writes its log to the
	# page cache (2), which a killed server does not lose either.
	local flush=1
	if [ "${TXOUTBOX_FSYNC:-on}" = off ]; then
		flush=2
	fi
	cat >"$dir/my.cnf" <<CONF
[mariadbd]
user = root
datadir = $dir/data
socket = $sock
pid-file = $dir/mariadbd.pid
port = $MARIADB_PORT
bind-address = 127.0.0.1
skip-name-resolve
max_connections = 600
innodb_buffer_pool_size = 256M
innodb_flush_log_at_trx_commit = $flush
log-error = $dir/error.log
# Its own temporary directory, not /tmp: a starting MariaDB deletes every
# #sql* file in its tmpdir, and the tests start and crash MariaDB servers
# of their own (internal/testkit/testenv) all through a run.
tmpdir = $dir
# The binlog, as production MySQL and MariaDB keep it for replicas and
# point-in-time recovery: log mode (binlogrelay) streams it, and table mode
# wakes its relay from it. Rows, full images, with the columns' names.
log-bin = $dir/binlog
binlog_format = ROW
binlog_row_image = FULL
binlog_row_metadata = FULL
server_id = 1
expire_logs_days = 1
CONF
	mariadb-install-db --defaults-file="$dir/my.cnf" --auth-root-authentication-method=socket >"$SVC/mariadb-install.log" 2>&1
	(exec nohup /usr/sbin/mariadbd --defaults-file="$dir/my.cnf" >"$dir/stdout.log" 2>&1 </dev/null) &
	local i
	for i in $(seq 1 120); do
		if mariadb --socket="$sock" -uroot -e 'SELECT 1' >/dev/null 2>&1; then
			break
		fi
		if ! kill -0 $! 2>/dev/null; then
			log "mariadb died at start; its error log says:"
			tail -n 20 "$dir/error.log" >&2
			return 1
		fi
		sleep 0.5
	done
	# Tests connect over TCP as a user that may create and drop their
	# throwaway databases.
	mariadb --socket="$sock" -uroot -e "CREATE USER IF NOT EXISTS 'txoutbox'@'127.0.0.1' IDENTIFIED BY 'test-pw';
GRANT ALL PRIVILEGES ON *.* TO 'txoutbox'@'127.0.0.1' WITH GRANT OPTION;" >&2
	# Log mode's least privileges (docs/mysql.md): the binlog's, and the
	# outbox database's rows; binlogrelay's tests use this user.
	mariadb --socket="$sock" -uroot -e "CREATE USER IF NOT EXISTS 'txoutbox_log'@'127.0.0.1' IDENTIFIED BY 'test-pw';
GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'txoutbox_log'@'127.0.0.1';" >&2
	log "mariadb $(mariadb --socket="$sock" -uroot -N -e 'SELECT VERSION()') up on 127.0.0.1:$MARIADB_PORT"
}

stop_mariadb() {
	local pidf="$SVC/mariadb/mariadbd.pid"
	if [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null; then
		local pid
		pid=$(cat "$pidf")
		kill "$pid" 2>/dev/null || true
		local i
		for i in $(seq 1 60); do
			kill -0 "$pid" 2>/dev/null || return 0
			sleep 0.5
		done
	fi
}

# rabbit_env NODE PORT DIST_PORT DIR prints a node's environment.
rabbit_env() {
	echo "RABBITMQ_NODENAME=$1 RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$2 RABBITMQ_DIST_PORT=$3 RABBITMQ_MNESIA_BASE=$4/mnesia RABBITMQ_LOG_BASE=$4/log RABBITMQ_ENABLED_PLUGINS_FILE=$4/enabled_plugins RABBITMQ_CONFIG_FILE=$4/rabbitmq"
}

# start_rabbitmq NODE PORT DIST_PORT DIR PORTVAR starts a node under DIR
# (PORTVAR names the variable that moves its port).
start_rabbitmq() (
	need_pkg rabbitmq-server rabbitmq-server
	local node=$1 port=$2 dir=$4 portvar=$5
	# shellcheck disable=SC2046
	export $(rabbit_env "$1" "$2" "$3" "$4")
	export ERL_EPMD_ADDRESS=127.0.0.1
	# Run the server and CLI directly as root, not through Debian's wrappers
	# that switch to the rabbitmq user: everything stays under .services/.
	local rbin=/usr/lib/rabbitmq/bin
	if "$rbin/rabbitmqctl" -n "$RABBITMQ_NODENAME" status >/dev/null 2>&1; then
		log "rabbitmq $node already running on $port"
		return
	fi
	port_free "$port" "rabbitmq $node" "$portvar"
	mkdir -p "$dir/mnesia" "$dir/log"
	rm -f "$dir/erl_crash.dump"
	echo '[].' >"$RABBITMQ_ENABLED_PLUGINS_FILE"
	# The guest user may log in from loopback only, which is where tests are.
	printf 'loopback_users.guest = true\n' >"$RABBITMQ_CONFIG_FILE.conf"
	# rabbitmq-server refuses to start without a cookie it can read.
	[ -f "$HOME/.erlang.cookie" ] || { head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$HOME/.erlang.cookie"; chmod 400 "$HOME/.erlang.cookie"; }
	(cd "$dir" && "$rbin/rabbitmq-server" -detached >&2)
	# -detached returns before the node registers with epmd, and
	# await_startup gives up at once on a node it cannot see yet.
	local i
	for i in $(seq 1 120); do
		"$rbin/rabbitmqctl" -n "$RABBITMQ_NODENAME" -q ping >/dev/null 2>&1 && break
		# A node that died does not come back: say so now, not in minutes.
		if [ -f "$dir/erl_crash.dump" ]; then
			log "rabbitmq $node died at start; its crash dump says:"
			head -n 3 "$dir/erl_crash.dump" >&2
			tail -n 20 "$dir"/log/*.log 2>/dev/null >&2 || true
			return 1
		fi
		sleep 0.5
	done
	"$rbin/rabbitmqctl" -n "$RABBITMQ_NODENAME" await_startup --timeout 120 >&2
	log "rabbitmq $node up on 127.0.0.1:$port"
)

start_goaws() {
	# goaws runs as its own process, not inside the test binaries through
	# its app/servertest: its handlers read the global topic and queue maps
	# without their locks (gosns.go:507 Publish against :124 CreateTopic),
	# which go test -race reports in any test publishing while another
	# creates a topic; servertest also leaves Region and AccountId empty
	# (malformed ARNs) and never starts the task that makes messages visible
	# again after their visibility timeout.
	local version=v0.4.5
	# The version is in the binary's name so that bumping it rebuilds.
	local bin="$SVC/bin/goaws-$version"
	if [ ! -x "$bin" ]; then
		mkdir -p "$SVC/bin"
		(cd "$ROOT" && GOBIN="$SVC/bin" go install "github.com/Admiral-Piett/goaws/app/cmd@$version" && mv "$SVC/bin/cmd" "$bin") >&2
	fi
	# goaws listens one port up; internal/testkit/cmd/goawsgate serves SNS_PORT in
	# front of it and lets one request at a time through, because goaws'
	# unlocked map reads can crash it when a Publish meets a CreateTopic.
	local inner=$((SNS_PORT + 1))
	(cd "$ROOT" && go build -o "$SVC/bin/goawsgate" ./internal/testkit/cmd/goawsgate) >&2
	if [ -f "$SVC/goaws.pid" ] && kill -0 "$(cat "$SVC/goaws.pid")" 2>/dev/null &&
		[ -f "$SVC/goawsgate.pid" ] && kill -0 "$(cat "$SVC/goawsgate.pid")" 2>/dev/null; then
		log "goaws already running on $SNS_PORT"
		return
	fi
	stop_goaws
	port_free "$SNS_PORT" goaws SNS
	port_free "$inner" "goaws (behind its gate, SNS_PORT + 1)" SNS
	mkdir -p "$SVC/goaws"
	# Host only names the emulator in the URLs it hands out (queue URLs,
	# SigningCertURL); it listens on every interface of SNS_PORT.
	cat >"$SVC/goaws/goaws.yaml" <<YAML
Local:
  Host: localhost
  Port: $inner
  Region: us-east-1
  AccountId: "100010001000"
  LogToFile: false
  EnableDuplicates: true
YAML
	# exec, so that the pid recorded is goaws' own and `stop` ends it (a
	# plain `&` inside the subshell recorded a wrapper shell's pid).
	(cd "$SVC/goaws" && exec nohup "$bin" -config "$SVC/goaws/goaws.yaml" Local >"$SVC/goaws/log" 2>&1 </dev/null) &
	echo $! >"$SVC/goaws.pid"
	(exec nohup "$SVC/bin/goawsgate" -listen "127.0.0.1:$SNS_PORT" -target "http://127.0.0.1:$inner" >"$SVC/goaws/gate.log" 2>&1 </dev/null) &
	echo $! >"$SVC/goawsgate.pid"
	# Ready when its router answers GET /health, not merely when the port
	# accepts connections.
	local i
	for i in $(seq 1 100); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$SNS_PORT" && printf 'GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3 && head -c 12 <&3 | grep -q ' 200') 2>/dev/null; then
			log "goaws $version up on 127.0.0.1:$SNS_PORT"
			return
		fi
		sleep 0.2
	done
	log "goaws did not start; its log and its gate's:"
	cat "$SVC/goaws/log" "$SVC/goaws/gate.log" >&2
	return 1
}

stop_goaws() {
	local f
	for f in "$SVC/goawsgate.pid" "$SVC/goaws.pid"; do
		if [ -f "$f" ]; then kill "$(cat "$f")" 2>/dev/null || true; rm -f "$f"; fi
	done
}

start_s3() {
	# gofakes3 speaks the S3 protocol over HTTP, as its own process with a
	# bolt file for storage: the archive's s3:// path is tested against a
	# server, through gocloud.dev/blob's s3blob and the AWS SDK, not an
	# in-process fake. No MinIO: it is not in Debian, and its server is
	# AGPL.
	local version=v1.2.0
	local bin="$SVC/bin/gofakes3-$version"
	if [ ! -x "$bin" ]; then
		mkdir -p "$SVC/bin"
		(cd "$ROOT" && GOBIN="$SVC/bin" go install "github.com/johannesboyne/gofakes3/cmd/gofakes3@$version" && mv "$SVC/bin/gofakes3" "$bin") >&2
	fi
	if [ -f "$SVC/s3.pid" ] && kill -0 "$(cat "$SVC/s3.pid")" 2>/dev/null; then
		log "gofakes3 already running on $S3_PORT"
		return
	fi
	port_free "$S3_PORT" gofakes3 S3
	mkdir -p "$SVC/s3"
	(cd "$SVC/s3" && exec nohup "$bin" -host "127.0.0.1:$S3_PORT" -backend bolt -bolt.db "$SVC/s3/s3.db" \
		-initialbucket txoutbox -autobucket -quiet >"$SVC/s3/log" 2>&1 </dev/null) &
	echo $! >"$SVC/s3.pid"
	local i
	for i in $(seq 1 100); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$S3_PORT" && printf 'GET /txoutbox HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3 && head -c 12 <&3 | grep -q ' 200') 2>/dev/null; then
			log "gofakes3 $version up on 127.0.0.1:$S3_PORT"
			return
		fi
		sleep 0.2
	done
	log "gofakes3 did not start; its log:"
	cat "$SVC/s3/log" >&2
	return 1
}

stop_s3() {
	if [ -f "$SVC/s3.pid" ]; then kill "$(cat "$SVC/s3.pid")" 2>/dev/null || true; rm -f "$SVC/s3.pid"; fi
}

start_nats() {
	# Debian's nats-server (2.9): JetStream with file storage, on loopback.
	# Tests that stop or crash a server start their own (testenv.StartNATS).
	need_pkg nats-server nats-server
	if [ -f "$SVC/nats.pid" ] && kill -0 "$(cat "$SVC/nats.pid")" 2>/dev/null; then
		log "nats-server already running on $NATS_PORT"
		return
	fi
	port_free "$NATS_PORT" nats-server NATS
	rm -rf "$SVC/nats"
	mkdir -p "$SVC/nats"
	(exec nohup nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$SVC/nats/js" -l "$SVC/nats/log" </dev/null >/dev/null 2>&1) &
	echo $! >"$SVC/nats.pid"
	local i
	for i in $(seq 1 100); do
		if grep -q "Server is ready" "$SVC/nats/log" 2>/dev/null; then
			log "nats-server $(nats-server --version | cut -d' ' -f2) up on 127.0.0.1:$NATS_PORT"
			return
		fi
		sleep 0.1
	done
	log "nats-server did not start; its log:"
	cat "$SVC/nats/log" >&2
	return 1
}

start_pgbouncer() {
	# Transaction pooling, as most production PgBouncers run: a server
	# connection belongs to a client only for one transaction. Run as the
	# postgres user (pgbouncer refuses root), trusting loopback as the
	# test cluster does.
	need_pkg /usr/sbin/pgbouncer pgbouncer
	local dir=$PG_DIR/pgbouncer
	# PgBouncer listens one port up; internal/testkit/cmd/pgbouncergate serves
	# PGBOUNCER_PORT in front of it and keeps cancel requests from it (see
	# below and the gate's doc).
	local inner=$((PGBOUNCER_PORT + 1))
	(cd "$ROOT" && go build -o "$SVC/bin/pgbouncergate" ./internal/testkit/cmd/pgbouncergate) >&2
	if [ -f "$dir/pgbouncer.pid" ] && kill -0 "$(cat "$dir/pgbouncer.pid")" 2>/dev/null &&
		[ -f "$dir/gate.pid" ] && kill -0 "$(cat "$dir/gate.pid")" 2>/dev/null; then
		log "pgbouncer already running on $PGBOUNCER_PORT"
		return
	fi
	stop_pgbouncer
	local i
	for i in $(seq 1 30); do
		(exec 3<>"/dev/tcp/127.0.0.1/$PGBOUNCER_PORT") 2>/dev/null || (exec 3<>"/dev/tcp/127.0.0.1/$inner") 2>/dev/null || break
		sleep 0.1 # a bouncer or gate just stopped, still closing its socket
	done
	port_free "$PGBOUNCER_PORT" "pgbouncer's gate" PGBOUNCER
	port_free "$inner" "pgbouncer (behind its gate, PGBOUNCER_PORT + 1)" PGBOUNCER
	mkdir -p "$dir"
	cat >"$dir/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$PG_PORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $inner
unix_socket_dir =
auth_type = trust
auth_file = $dir/users.txt
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 40
max_db_connections = 60
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
	echo '"postgres" ""' >"$dir/users.txt"
	chown -R postgres "$dir"
	# PgBouncer 1.18 (Debian 12's) exits with "server_proto: server in bad
	# state: 11" when a cancel request meets the end of the query it
	# cancels (pgbouncer#822, fixed in 1.21 by pgbouncer#927). pgx sends
	# one whenever a context ends mid-query (a relay stopped mid-claim):
	# two clean make test runs lost the bouncer that way, and with it the
	# tests connected to it or connecting while it was down. The gate
	# keeps cancel requests from it (and logs each one in gate.log); a
	# supervisor still starts it again should it exit for another reason,
	# and logs each restart in restarts.log, which make test prints.
	rm -f "$dir/restarts.log"
	touch "$dir/supervise"
	(
		while [ -f "$dir/supervise" ]; do
			su postgres -s /bin/sh -c "/usr/sbin/pgbouncer $dir/pgbouncer.ini" >/dev/null 2>&1 || true
			[ -f "$dir/supervise" ] || break
			echo "$(date -u +%FT%TZ) pgbouncer exited and was started again; its last FATAL: $(grep FATAL "$dir/pgbouncer.log" | tail -n 1)" >>"$dir/restarts.log"
			sleep 0.1
		done
	) </dev/null >/dev/null 2>&1 &
	echo $! >"$dir/supervisor.pid"
	(exec nohup "$SVC/bin/pgbouncergate" -listen "127.0.0.1:$PGBOUNCER_PORT" -target "127.0.0.1:$inner" >"$dir/gate.log" 2>&1 </dev/null) &
	echo $! >"$dir/gate.pid"
	for i in $(seq 1 100); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$inner") 2>/dev/null && (exec 3<>"/dev/tcp/127.0.0.1/$PGBOUNCER_PORT") 2>/dev/null; then
			log "pgbouncer $(/usr/sbin/pgbouncer --version | head -1 | cut -d' ' -f2) up on 127.0.0.1:$PGBOUNCER_PORT (transaction pooling)"
			return
		fi
		sleep 0.1
	done
	log "pgbouncer did not start; its log:"
	cat "$dir/pgbouncer.log" >&2
	return 1
}

stop_pgbouncer() {
	local dir=$PG_DIR/pgbouncer
	rm -f "$dir/supervise"
	if [ -f "$dir/supervisor.pid" ]; then kill "$(cat "$dir/supervisor.pid")" 2>/dev/null || true; rm -f "$dir/supervisor.pid"; fi
	if [ -f "$dir/pgbouncer.pid" ]; then kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || true; rm -f "$dir/pgbouncer.pid"; fi
	if [ -f "$dir/gate.pid" ]; then kill "$(cat "$dir/gate.pid")" 2>/dev/null || true; rm -f "$dir/gate.pid"; fi
}

stop_nats() {
	if [ -f "$SVC/nats.pid" ]; then kill "$(cat "$SVC/nats.pid")" 2>/dev/null || true; rm -f "$SVC/nats.pid"; fi
}

write_env() {
	cat >"$SVC/env" <<ENV
export TXOUTBOX_PG_DSN='postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable'
export TXOUTBOX_MYSQL_DSN='mysql://txoutbox:test-pw@127.0.0.1:$MARIADB_PORT/'
export TXOUTBOX_AMQP_URL='amqp://guest:guest@127.0.0.1:$AMQP_PORT/'
export TXOUTBOX_RABBITMQCTL='/usr/lib/rabbitmq/bin/rabbitmqctl -n $RABBIT_NODE'
export TXOUTBOX_SNS_ENDPOINT='http://127.0.0.1:$SNS_PORT'
export TXOUTBOX_CHROMIUM='/usr/bin/chromium'
export TXOUTBOX_NATS_URL='nats://127.0.0.1:$NATS_PORT'
# PgBouncer in transaction pooling mode in front of TXOUTBOX_PG_DSN's server.
export TXOUTBOX_PGBOUNCER_DSN='postgres://postgres@127.0.0.1:$PGBOUNCER_PORT/postgres?sslmode=disable'
export TXOUTBOX_PGBOUNCER_RESTARTS='$PG_DIR/pgbouncer/restarts.log'
export TXOUTBOX_PGBOUNCER_GATE_LOG='$PG_DIR/pgbouncer/gate.log'
export TXOUTBOX_S3_URL='s3://txoutbox?endpoint=http://127.0.0.1:$S3_PORT&use_path_style=true&region=us-east-1&anonymous=true'
export TXOUTBOX_RABBITMQ_ENV='$(rabbit_env "$RABBIT_NODE" "$AMQP_PORT" "$AMQP_DIST_PORT" "$SVC/rabbitmq")'
# The node the outage tests stop and start (make test points them at it).
export TXOUTBOX_OUTAGE_AMQP_URL='amqp://guest:guest@127.0.0.1:$OUTAGE_AMQP_PORT/'
export TXOUTBOX_OUTAGE_RABBITMQCTL='/usr/lib/rabbitmq/bin/rabbitmqctl -n $OUTAGE_NODE'
export TXOUTBOX_OUTAGE_RABBITMQ_ENV='$(rabbit_env "$OUTAGE_NODE" "$OUTAGE_AMQP_PORT" "$OUTAGE_AMQP_DIST_PORT" "$SVC/rabbitmq-outage")'
export TXOUTBOX_OUTAGE2_AMQP_URL='amqp://guest:guest@127.0.0.1:$OUTAGE2_AMQP_PORT/'
export TXOUTBOX_OUTAGE2_RABBITMQCTL='/usr/lib/rabbitmq/bin/rabbitmqctl -n $OUTAGE2_NODE'
export TXOUTBOX_OUTAGE2_RABBITMQ_ENV='$(rabbit_env "$OUTAGE2_NODE" "$OUTAGE2_AMQP_PORT" "$OUTAGE2_AMQP_DIST_PORT" "$SVC/rabbitmq-outage2")'
ENV
	log "environment in $SVC/env"
}

stop_all() {
	if [ -d "$PG_DIR/data" ]; then
		su postgres -s /bin/sh -c "$PGBIN/pg_ctl -D $PG_DIR/data -m fast stop" >&2 || true
	fi
	/usr/lib/rabbitmq/bin/rabbitmqctl -n "$RABBIT_NODE" stop >&2 2>/dev/null || true
	/usr/lib/rabbitmq/bin/rabbitmqctl -n "$OUTAGE_NODE" stop >&2 2>/dev/null || true
	/usr/lib/rabbitmq/bin/rabbitmqctl -n "$OUTAGE2_NODE" stop >&2 2>/dev/null || true
	stop_goaws
	stop_s3
	stop_nats
	stop_pgbouncer
	stop_mariadb
}

case "${1:-start}" in
start)
	mkdir -p "$SVC"
	# The console's browser tests drive a real Chromium (chromedp).
	need_pkg /usr/bin/chromium chromium
	start_postgres
	start_pgbouncer
	start_mariadb
	start_rabbitmq "$RABBIT_NODE" "$AMQP_PORT" "$AMQP_DIST_PORT" "$SVC/rabbitmq" AMQP
	start_rabbitmq "$OUTAGE_NODE" "$OUTAGE_AMQP_PORT" "$OUTAGE_AMQP_DIST_PORT" "$SVC/rabbitmq-outage" OUTAGE_AMQP
	start_rabbitmq "$OUTAGE2_NODE" "$OUTAGE2_AMQP_PORT" "$OUTAGE2_AMQP_DIST_PORT" "$SVC/rabbitmq-outage2" OUTAGE2_AMQP
	start_goaws
	start_s3
	start_nats
	write_env
	;;
stop) stop_all ;;
*) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
