#!/usr/bin/env bash
# Starts Debian's PgBouncer on loopback in front of the test database, in
# transaction pooling mode with a small server pool, for the tests that run
# txhook through it (outbox.TestPgBouncer*). Prints the DSN of the test
# database through PgBouncer on stdout (everything else goes to stderr):
#
#     export TXHOOK_TEST_PGBOUNCER_DSN=$(bash .ci/pgbouncer.sh)
#     TXHOOK_REQUIRE_PGBOUNCER=1 go test -race -run PgBouncer ./outbox
#
# Installs the pgbouncer package when it is missing (Debian or Ubuntu, as
# root). Idempotent: when the PgBouncer this script started is still
# running it only prints the DSN. PgBouncer refuses to run as root, so as
# root it runs as the user postgres.
#
# Settings, from the environment:
#   TXHOOK_PGBOUNCER_DIR       run directory (config, log, pid); /tmp/txhook-pgbouncer
#   TXHOOK_PGBOUNCER_PORT      port on 127.0.0.1; 6432
#   TXHOOK_PGBOUNCER_POOL      server connections to PostgreSQL; 4
#   TXHOOK_PGBOUNCER_UPSTREAM  libpq settings of the database behind it;
#                              "host=127.0.0.1 port=5432 dbname=test"
set -euo pipefail

log() { printf 'pgbouncer: %s\n' "$*" >&2; }

dir=${TXHOOK_PGBOUNCER_DIR:-/tmp/txhook-pgbouncer}
port=${TXHOOK_PGBOUNCER_PORT:-6432}
pool=${TXHOOK_PGBOUNCER_POOL:-4}
upstream=${TXHOOK_PGBOUNCER_UPSTREAM:-host=127.0.0.1 port=5432 dbname=test}
dsn="postgres://postgres@127.0.0.1:${port}/test?sslmode=disable"

if ! command -v pgbouncer >/dev/null; then
	if ((EUID != 0)); then
		log "pgbouncer is not installed, and installing it needs root"
		exit 1
	fi
	source "$(dirname "$0")/apt.sh"
	apt_install pgbouncer
fi
log "$(pgbouncer --version | head -n 1)"

ready() { pg_isready -q -h 127.0.0.1 -p "$port" -d test -U postgres; }

pidfile=$dir/pgbouncer.pid
if [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null && ready; then
	log "already running (pid $(cat "$pidfile")) on 127.0.0.1:$port"
	echo "$dsn"
	exit 0
fi

mkdir -p "$dir"
cat >"$dir/userlist.txt" <<'EOF'
"postgres" ""
"root" ""
EOF
# Transaction pooling with fewer server connections than the tests' client
# connections, so that one server connection serves many clients'
# transactions in turn; a client waits (query_wait_timeout) rather than fails
# while all are busy.
cat >"$dir/pgbouncer.ini" <<EOF
[databases]
test = $upstream

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = $pool
min_pool_size = 0
reserve_pool_size = 0
max_db_connections = $pool
max_client_conn = 2000
query_wait_timeout = 120
; lib/pq sends extra_float_digits at startup.
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $pidfile
EOF

run=()
if ((EUID == 0)); then
	chown -R postgres: "$dir"
	run=(runuser -u postgres --)
fi
rm -f "$pidfile"
"${run[@]}" pgbouncer -d "$dir/pgbouncer.ini"

for _ in $(seq 1 60); do
	ready && break
	sleep 0.5
done
if ! ready; then
	log "did not become ready on 127.0.0.1:$port; its log:"
	tail -n 20 "$dir/pgbouncer.log" >&2 || true
	exit 1
fi
log "pool_mode=transaction, $pool server connections, on 127.0.0.1:$port (pid $(cat "$pidfile"))"
echo "$dsn"
