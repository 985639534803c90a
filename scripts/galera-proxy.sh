#!/usr/bin/env bash
# HAProxy in front of the Galera test bed (scripts/galera.sh), from Debian's package: the
# way most Galera users send every write to one node and avoid certification conflicts.
# It listens on 127.0.0.1:4300 and sends each new connection to node 1 (port 4301) while
# node 1 answers its MySQL health check, else to node 2, then node 3 (backups, in that
# order). When the node it uses is marked down, it closes that node's client connections
# at once (`on-marked-down shutdown-sessions`) rather than leave them waiting; when node 1
# is back, clients move back to it as they reconnect. Files under $GALERA_DIR/haproxy.
#
#   bash scripts/galera-proxy.sh start   # idempotent (starts the cluster too); prints the URL
#   bash scripts/galera-proxy.sh stop
#   bash scripts/galera-proxy.sh url
#   bash scripts/galera-proxy.sh cut     # closes every connection to the node in use (its sessions go on)
#   bash scripts/galera-proxy.sh node    # the node new connections go to (1, 2 or 3)
#
# Run as root (or with sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/servers.sh
source scripts/servers.sh

dir=${GALERA_DIR:-/var/tmp/diesel-occ-galera}/haproxy
port=4300

# `prefer_socket=false`: diesel-async's MySQL client (mysql_async) otherwise asks a server
# on loopback for its Unix socket and reconnects through it, past the proxy. diesel's own
# client ignores the parameter.
url() { echo "mysql://root@127.0.0.1:$port/diesel_occ_test?prefer_socket=false"; }
running() { pid_running "$dir/haproxy.pid"; }
admin() { echo "$1" | as_root socat stdio "unix-connect:$dir/admin.sock"; }
# The node whose server line is up and active: the first of 1, 2, 3 that is UP.
node_in_use() {
    admin "show servers state galera" |
        awk '$4 ~ /^node[0-9]$/ && $6 == 2 { print substr($4, 5); exit }'
}

write_config() {
    as_root mkdir -p "$dir"
    { haproxy_head "$dir"; cat <<EOF; } | as_root tee "$dir/haproxy.cfg" >/dev/null
listen galera
    bind 127.0.0.1:$port
    option mysql-check user root
    default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions
    server node1 127.0.0.1:4301 check
    server node2 127.0.0.1:4302 check backup
    server node3 127.0.0.1:4303 check backup
EOF
}

start() {
    ensure_packages haproxy socat
    bash scripts/galera.sh start >/dev/null
    running && return 0
    write_config
    as_root haproxy -f "$dir/haproxy.cfg"
    wait_for "HAProxy on port $port" mariadb-admin --protocol=tcp -h 127.0.0.1 -P $port -u root ping
}

stop() { stop_pid "$dir/haproxy.pid" TERM; }

case ${1:-start} in
start) start; url ;;
stop) stop ;;
url) url ;;
cut) admin "shutdown sessions server galera/node$(node_in_use)" >/dev/null ;;
node) node_in_use ;;
*) echo "usage: $0 start|stop|url|cut|node" >&2; exit 2 ;;
esac
