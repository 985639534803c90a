#!/usr/bin/env bash
# A PostgreSQL primary and a streaming hot standby on loopback, from Debian's packages
# (the machine's PostgreSQL binaries; the standby is a pg_basebackup of the primary), for
# the replica tests. Data under $PG_REPLICA_DIR (default /var/tmp/diesel-occ-pg-replica),
# primary on port 5441, standby on 5442, replication asynchronous (the default).
#
#   bash scripts/pg-replica.sh start      # a fresh pair (any earlier one is removed); prints the URLs
#   bash scripts/pg-replica.sh start-sync # the same, replication synchronous (remote_apply)
#   bash scripts/pg-replica.sh stop       # both servers down, data removed
#   bash scripts/pg-replica.sh urls       # primary URL,standby URL
#   bash scripts/pg-replica.sh detach     # the standby stops: what the primary commits next is not replicated
#   bash scripts/pg-replica.sh fail-over  # the primary dies (immediate stop), the standby starts and is promoted
#
# `detach` then `fail-over` is an asynchronous failover that loses the primary's last
# commits, as a crash of the primary before its WAL reached the standby does. Run as root
# (or with sudo): the servers run as the postgres user.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/servers.sh
source scripts/servers.sh

dir=${PG_REPLICA_DIR:-/var/tmp/diesel-occ-pg-replica}
primary_port=5441
standby_port=5442
bin=/usr/lib/postgresql/$(ls /usr/lib/postgresql | sort -V | tail -n 1)/bin

as_postgres() { as_root runuser -u postgres -- "$@"; }
url() { echo "postgres://postgres@127.0.0.1:$1/diesel_occ_test"; }
ready() { "$bin/pg_isready" -q -h 127.0.0.1 -p "$1"; }
sql() { psql -h 127.0.0.1 -p "$1" -U postgres -d postgres -Atc "$2"; }

server_down() { # data folder
    if as_root test -f "$1/postmaster.pid"; then
        as_postgres "$bin/pg_ctl" -D "$1" -m "${2:-fast}" -w stop >/dev/null 2>&1 || true
    fi
}

start_server() { # data folder, port
    as_postgres "$bin/pg_ctl" -D "$1" -l "$1/server.log" -o "-p $2" -w start >/dev/null
    wait_for "PostgreSQL on port $2" ready "$2"
}

init_primary() {
    as_postgres "$bin/initdb" -D "$dir/primary" -U postgres --auth=trust >/dev/null
    as_postgres tee -a "$dir/primary/postgresql.conf" >/dev/null <<EOF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
wal_level = replica
max_wal_senders = 4
hot_standby = on
fsync = off
synchronous_commit = local
EOF
    echo "host replication postgres 127.0.0.1/32 trust" |
        as_postgres tee -a "$dir/primary/pg_hba.conf" >/dev/null
    start_server "$dir/primary" $primary_port
    sql $primary_port "CREATE DATABASE diesel_occ_test" >/dev/null
}

init_standby() {
    # -R writes primary_conninfo and standby.signal: the copy starts as a streaming standby.
    as_postgres "$bin/pg_basebackup" -h 127.0.0.1 -p $primary_port -U postgres \
        -D "$dir/standby" -R -X stream -c fast >/dev/null
    start_server "$dir/standby" $standby_port
    wait_for "the standby streaming" streaming
}

streaming() {
    [ "$(sql $primary_port "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" = 1 ]
}
synchronous() {
    [ "$(sql $primary_port "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")" = 1 ]
}
promoted() { [ "$(sql $standby_port "SELECT pg_is_in_recovery()")" = f ]; }

stop_all() {
    server_down "$dir/standby" immediate
    server_down "$dir/primary" immediate
    as_root rm -rf "$dir"
}

case ${1:-} in
start | start-sync)
    stop_all
    as_root mkdir -p "$dir"
    as_root chown postgres "$dir"
    init_primary
    init_standby
    if [ "$1" = start-sync ]; then
        # Once the standby streams: any standby counts, and a COMMIT returns once it has
        # applied the commit.
        sql $primary_port "ALTER SYSTEM SET synchronous_standby_names = '*'" >/dev/null
        sql $primary_port "ALTER SYSTEM SET synchronous_commit = remote_apply" >/dev/null
        sql $primary_port "SELECT pg_reload_conf()" >/dev/null
        wait_for "the standby synchronous" synchronous
    fi
    echo "$(url $primary_port),$(url $standby_port)"
    ;;
stop) stop_all ;;
urls) echo "$(url $primary_port),$(url $standby_port)" ;;
detach) server_down "$dir/standby" fast ;;
fail-over)
    server_down "$dir/primary" immediate
    # Without its primary the standby replays what it holds, then is promoted.
    as_root test -f "$dir/standby/postmaster.pid" || start_server "$dir/standby" $standby_port
    as_postgres "$bin/pg_ctl" -D "$dir/standby" -w promote >/dev/null
    wait_for "the promoted standby accepting writes" promoted
    ;;
*)
    echo "usage: $0 start|start-sync|stop|urls|detach|fail-over" >&2
    exit 2
    ;;
esac
