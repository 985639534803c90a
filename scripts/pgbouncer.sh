#!/usr/bin/env bash
# PgBouncer in transaction pooling mode on loopback, in front of the local PostgreSQL
# (127.0.0.1:5432): consecutive transactions of one client may run on different server
# sessions, as in most PostgreSQL deployments at scale. Two of them, each passing every
# database name through to the server as user postgres:
#
# - 127.0.0.1:6432, Debian 12's package (PgBouncer 1.18), which keeps no prepared
#   statement across server sessions;
# - 127.0.0.1:6433, PgBouncer 1.24.1 built from Debian 13's source package (checked
#   against its SHA-256) with `max_prepared_statements = 200`: it prepares a client's
#   named statements again on whichever server session runs them (1.21 and newer).
#
# Files under $PGBOUNCER_DIR (default /var/tmp/diesel-occ-pgbouncer); the build is kept
# there, so only the first start compiles (about a minute).
#
#   bash scripts/pgbouncer.sh start    # idempotent; prints the two URLs, 6432's first
#   bash scripts/pgbouncer.sh stop
#   bash scripts/pgbouncer.sh restart  # both stopped at once (every client connection cut), started again
#   bash scripts/pgbouncer.sh urls
#
# What the library needs behind each is in the guide's chapter on poolers. Run as root
# (or with sudo): PgBouncer runs as postgres.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/servers.sh
source scripts/servers.sh

dir=${PGBOUNCER_DIR:-/var/tmp/diesel-occ-pgbouncer}
source_version=1.24.1
source_sha256=da72a3aba13072876d055a3e58dd4aba4a5de4ed6148e73033185245598fd3e0
built=$dir/pgbouncer-$source_version/pgbouncer

port() { case $1 in debian) echo 6432 ;; built) echo 6433 ;; esac; }
url() { echo "postgres://postgres@127.0.0.1:$(port "$1")/diesel_occ_test"; }
urls() { echo "$(url debian),$(url built)"; }
ready() { pg_isready -q -h 127.0.0.1 -p "$(port "$1")" -d diesel_occ_test; }
pidfile() { echo "$dir/$1/pgbouncer.pid"; }
running() { pid_running "$(pidfile "$1")"; }

build_current() {
    [ -x "$built" ] && return 0
    step "building PgBouncer $source_version from Debian's source package"
    ensure_packages gcc make curl libevent-dev libc-ares-dev libssl-dev pkgconf
    as_root mkdir -p "$dir"
    local tarball=$dir/pgbouncer_$source_version.orig.tar.gz
    as_root curl -fsS -m 120 -o "$tarball" \
        "http://deb.debian.org/debian/pool/main/p/pgbouncer/pgbouncer_$source_version.orig.tar.gz"
    echo "$source_sha256  $tarball" | sha256sum -c --quiet
    as_root tar -xzf "$tarball" -C "$dir"
    as_root sh -c "cd '$dir/pgbouncer-$source_version' &&
        ./configure --without-pam --without-systemd >'$dir/build.log' 2>&1 &&
        make >>'$dir/build.log' 2>&1" || { as_root tail -n 20 "$dir/build.log"; exit 1; }
}

write_config() { # instance
    as_root mkdir -p "$dir/$1"
    as_root chown postgres "$dir/$1"
    local extra=""
    [ "$1" = built ] && extra="max_prepared_statements = 200"
    # `auth_type = any` with a user on the database line: every client is postgres,
    # trusted as the local server trusts it. The pool is smaller than the tests'
    # connections, so that clients really do share server sessions.
    as_root runuser -u postgres -- tee "$dir/$1/pgbouncer.ini" >/dev/null <<EOF
[databases]
* = host=127.0.0.1 port=5432 user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $(port "$1")
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 8
max_client_conn = 400
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = $dir/$1/pgbouncer.log
pidfile = $(pidfile "$1")
$extra
EOF
}

start_one() { # instance
    running "$1" && return 0
    write_config "$1"
    local binary=/usr/sbin/pgbouncer
    [ "$1" = built ] && binary=$built
    as_root runuser -u postgres -- "$binary" -d -q "$dir/$1/pgbouncer.ini"
    wait_for "PgBouncer ($1) on port $(port "$1")" ready "$1"
}

stop_one() { # instance
    # An immediate shutdown, every client and server connection closed: SIGTERM before
    # 1.23, SIGQUIT since (1.23 made SIGTERM wait for the clients to leave).
    local signal=QUIT
    [ "$1" = debian ] && signal=TERM
    stop_pid "$(pidfile "$1")" "$signal"
}

start() {
    ensure_packages pgbouncer
    build_current
    start_postgres
    start_one debian
    start_one built
}

stop() { stop_one debian; stop_one built; }

case ${1:-start} in
start) start; urls ;;
stop) stop ;;
restart) stop; start ;;
urls) urls ;;
*) echo "usage: $0 start|stop|restart|urls" >&2; exit 2 ;;
esac
