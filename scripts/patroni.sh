#!/usr/bin/env bash
# A Patroni cluster of two PostgreSQL nodes with one etcd, on loopback, from Debian's
# packages (patroni, etcd-server, haproxy; the machine's PostgreSQL binaries): Patroni
# promotes a standby by itself, demotes and rewinds the old primary, and clients find the
# primary through libpq's multi-host URLs or through HAProxy, which asks each node's
# Patroni REST API which one is primary. Data under $PATRONI_DIR (default
# /var/tmp/diesel-occ-patroni); PostgreSQL on 5451 and 5452, Patroni's API on 8008 and
# 8009, etcd on 2379, HAProxy on 5450. Replication is synchronous and strict
# (`synchronous_mode_strict`): a failover loses no acknowledged commit.
#
#   bash scripts/patroni.sh start       # a fresh cluster (any earlier one is removed); prints the two URLs
#   bash scripts/patroni.sh stop        # everything down, data removed
#   bash scripts/patroni.sh urls        # the multi-host URL, then HAProxy's
#   bash scripts/patroni.sh switchover  # a planned switchover to the standby, back once it accepts writes
#   bash scripts/patroni.sh fail-over   # the primary killed (Patroni and PostgreSQL, SIGKILL); back once the
#                                       # standby is promoted and the old primary has rejoined as a standby
#
# Run as root (or with sudo): Patroni and PostgreSQL run as postgres.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/servers.sh
source scripts/servers.sh

dir=${PATRONI_DIR:-/var/tmp/diesel-occ-patroni}
bin=/usr/lib/postgresql/$(ls /usr/lib/postgresql | sort -V | tail -n 1)/bin
nodes=(1 2)
pg_port() { echo $((5450 + $1)); }
api_port() { echo $((8007 + $1)); }

as_postgres() { as_root runuser -u postgres -- "$@"; }
multi_host_url() {
    echo "postgres://postgres@127.0.0.1:$(pg_port 1),127.0.0.1:$(pg_port 2)/diesel_occ_test?target_session_attrs=read-write"
}
proxy_url() { echo "postgres://postgres@127.0.0.1:5450/diesel_occ_test"; }
urls() { echo "$(multi_host_url),$(proxy_url)"; }
role() { curl -s -m 2 "http://127.0.0.1:$(api_port "$1")/patroni" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("role",""))' 2>/dev/null || true; }
# Patroni 3.0 says "master", later versions "primary".
primary() {
    for n in "${nodes[@]}"; do
        case $(role "$n") in primary | master) echo "$n"; return 0 ;; esac
    done
    return 1
}
accepts_writes() { # node
    [ "$(psql -h 127.0.0.1 -p "$(pg_port "$1")" -U postgres -d postgres -Atc 'SELECT NOT pg_is_in_recovery()' 2>/dev/null)" = t ]
}
streaming() { # node: a standby that streams from the primary
    [ "$(role "$1")" = replica ] &&
        [ "$(psql -h 127.0.0.1 -p "$(pg_port "$1")" -U postgres -d postgres -Atc \
            "SELECT status FROM pg_stat_wal_receiver" 2>/dev/null)" = streaming ]
}
primary_is() { [ "$(primary)" = "$1" ]; }
one_primary_one_standby() {
    local p
    p=$(primary) || return 1
    accepts_writes "$p" && streaming $((3 - p))
}
# HAProxy counts a server up until its health checks say otherwise, and takes turns
# between the servers it counts up: six connections in a row that reach a writable node
# mean the standby is out of its turns.
proxy_on_primary_only() {
    for _ in 1 2 3 4 5 6; do
        [ "$(psql "$(proxy_url)?connect_timeout=2" -Atc 'SELECT NOT pg_is_in_recovery()' 2>/dev/null)" = t ] || return 1
    done
}

write_config() { # node
    local n=$1
    as_postgres tee "$dir/node$n.yml" >/dev/null <<EOF
scope: diesel-occ
name: node$n
restapi:
  listen: 127.0.0.1:$(api_port "$n")
  connect_address: 127.0.0.1:$(api_port "$n")
etcd:
  hosts: 127.0.0.1:2379
bootstrap:
  dcs:
    # A primary that stops renewing its leader key is replaced within ttl seconds.
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1073741824
    # A commit returns once the standby holds it, and with the standby gone writes wait:
    # a failover loses no acknowledged commit (see the guide's chapter on topologies).
    synchronous_mode: true
    synchronous_mode_strict: true
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 5
        max_replication_slots: 5
        fsync: "off"
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - host replication postgres 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
    - local all all trust
postgresql:
  listen: 127.0.0.1:$(pg_port "$n")
  connect_address: 127.0.0.1:$(pg_port "$n")
  data_dir: $dir/data$n
  bin_dir: $bin
  pgpass: $dir/pgpass$n
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: $dir
EOF
}

start_node() { # node
    as_root setsid sh -c "exec runuser -u postgres -- patroni '$dir/node$1.yml' \
        </dev/null >>'$dir/patroni$1.log' 2>&1" </dev/null >/dev/null 2>&1 &
}

kill_node() { # node: Patroni and its PostgreSQL, at once
    local pids
    pids=$(pgrep -f "patroni $dir/node$1.yml" | grep -v "^$$\$" || true)
    [ -z "$pids" ] || as_root kill -9 $pids 2>/dev/null || true
    if as_root test -f "$dir/data$1/postmaster.pid"; then
        as_root kill -9 "$(as_root head -n 1 "$dir/data$1/postmaster.pid")" 2>/dev/null || true
    fi
    # The postmaster's children end once they find it gone.
    for _ in $(seq 1 50); do
        pgrep -f -- "-D $dir/data$1" >/dev/null || pgrep -f "$dir/data$1" >/dev/null || return 0
        sleep 0.1
    done
    as_root pkill -9 -f "$dir/data$1" 2>/dev/null || true
}

write_proxy_config() {
    { haproxy_head "$dir"; cat <<EOF; } | as_root tee "$dir/haproxy.cfg" >/dev/null
listen primary
    bind 127.0.0.1:5450
    # Patroni answers 200 on /primary only on the node that holds the leader key.
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions
    server node1 127.0.0.1:$(pg_port 1) check port $(api_port 1)
    server node2 127.0.0.1:$(pg_port 2) check port $(api_port 2)
EOF
    as_root haproxy -f "$dir/haproxy.cfg"
}

stop_all() {
    for n in "${nodes[@]}"; do kill_node "$n"; done
    stop_pid "$dir/haproxy.pid" TERM
    local etcd
    etcd=$(pgrep -f "etcd --name diesel-occ" || true)
    if [ -n "$etcd" ]; then
        as_root kill $etcd 2>/dev/null || true
        for _ in $(seq 1 100); do pgrep -f "etcd --name diesel-occ" >/dev/null || break; sleep 0.1; done
        as_root pkill -9 -f "etcd --name diesel-occ" 2>/dev/null || true
    fi
    as_root rm -rf "$dir"
}

start_all() {
    ensure_packages patroni etcd-server etcd-client haproxy python3-etcd curl
    stop_all
    as_root mkdir -p "$dir"
    as_root chown postgres "$dir"
    # etcd's v2 API, which Debian's Patroni speaks (python3-etcd).
    as_root setsid sh -c "exec etcd --name diesel-occ --data-dir '$dir/etcd' --enable-v2=true \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster diesel-occ=http://127.0.0.1:2380 </dev/null >'$dir/etcd.log' 2>&1" \
        </dev/null >/dev/null 2>&1 &
    # This bed's etcd, not another on the port: its member is named diesel-occ.
    wait_for "etcd" bash -c "curl -sf http://127.0.0.1:2379/v2/members | grep -q '\"diesel-occ\"'"
    for n in "${nodes[@]}"; do write_config "$n"; done
    start_node 1
    wait_within 120 "Patroni's first primary" accepts_writes 1
    start_node 2
    wait_within 120 "the standby streaming" one_primary_one_standby
    psql -h 127.0.0.1 -p "$(pg_port 1)" -U postgres -d postgres -qc "CREATE DATABASE diesel_occ_test"
    write_proxy_config
    wait_for "HAProxy sending to the primary alone" proxy_on_primary_only
    urls
}

case ${1:-} in
start) start_all ;;
stop) stop_all ;;
urls) urls ;;
switchover)
    old=$(primary)
    as_postgres patronictl -c "$dir/node$old.yml" switchover --leader "node$old" \
        --candidate "node$((3 - old))" --force >/dev/null
    wait_within 120 "the switchover" primary_is $((3 - old))
    wait_within 120 "the new primary accepting writes, the old one streaming from it" one_primary_one_standby
    wait_for "HAProxy sending to the new primary alone" proxy_on_primary_only
    ;;
fail-over)
    old=$(primary)
    kill_node "$old"
    wait_within 120 "the standby promoted" accepts_writes $((3 - old))
    start_node "$old"
    wait_within 120 "the old primary rejoined as a standby" one_primary_one_standby
    wait_for "HAProxy sending to the new primary alone" proxy_on_primary_only
    ;;
primary) primary ;;
*)
    echo "usage: $0 start|stop|urls|switchover|fail-over" >&2
    exit 2
    ;;
esac
