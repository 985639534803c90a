#!/usr/bin/env bash
# A 3-node MariaDB Galera cluster on loopback, from Debian's packages (mariadb-server and
# galera-4), for the cluster tests. Each node is its own mariadbd with its own data folder
# under $GALERA_DIR (default /var/tmp/diesel-occ-galera), SQL ports 4301-4303 and Galera
# ports 4567, 4577, 4587 (replication) and 4568, 4578, 4588 (incremental transfer).
#
#   bash scripts/galera.sh start   # idempotent: starts what is not running; prints the URLs
#   bash scripts/galera.sh stop
#   bash scripts/galera.sh urls    # the three URLs, comma-separated
#   bash scripts/galera.sh bounce N  # node N killed (SIGKILL), started again, back once synced
#
# No state transfer is needed at the first start: the first node is set up alone, shut
# down cleanly, and its data folder copied to the other two, so all three start from the
# same cluster state (as root, Galera's rsync transfer fails, and a mysqldump transfer
# would need a running joiner with the donor's credentials). A node that was stopped
# rejoins by an incremental transfer from the others' cache, which is large (512 MB a
# node) so that a node killed late in a long soak still finds its position there: when
# it does not, the fallback mysqldump transfer drops and reloads every table while
# clients already reach the node, and reloads triggers it cannot parse.
#
# Run as root (or with sudo). The nodes flush their logs once a second rather than at each
# commit: on a cluster a commit is durable once the others hold it, and the tests need
# speed, not a crash-proof disk.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/servers.sh
source scripts/servers.sh

dir=${GALERA_DIR:-/var/tmp/diesel-occ-galera}
nodes=(1 2 3)
sql_port() { echo $((4300 + $1)); }
gcomm_port() { echo $((4557 + 10 * $1)); }
members() {
    local list=()
    for n in "${nodes[@]}"; do list+=("127.0.0.1:$(gcomm_port "$n")"); done
    (IFS=,; echo "${list[*]}")
}
urls() {
    local list=()
    for n in "${nodes[@]}"; do list+=("mysql://root@127.0.0.1:$(sql_port "$n")/diesel_occ_test"); done
    (IFS=,; echo "${list[*]}")
}
ping_node() { mariadb-admin --protocol=tcp -h 127.0.0.1 -P "$(sql_port "$1")" -u root ping; }
sql() { mariadb --protocol=tcp -h 127.0.0.1 -P "$(sql_port "$1")" -u root -N -e "$2"; }

write_config() { # node
    local n=$1 port gport
    port=$(sql_port "$n")
    gport=$(gcomm_port "$n")
    cat >"$dir/node$n.cnf" <<EOF
[mysqld]
user = mysql
datadir = $dir/node$n/data
socket = $dir/node$n/mysqld.sock
pid-file = $dir/node$n/mysqld.pid
log-error = $dir/node$n/error.log
port = $port
bind-address = 127.0.0.1
skip-name-resolve
innodb_buffer_pool_size = 64M
innodb_log_file_size = 32M
innodb_flush_log_at_trx_commit = 2
binlog_format = ROW
default_storage_engine = InnoDB
innodb_autoinc_lock_mode = 2
wsrep_on = ON
wsrep_provider = /usr/lib/galera/libgalera_smm.so
wsrep_cluster_name = diesel_occ_test
wsrep_cluster_address = gcomm://$(members)
wsrep_node_name = node$n
wsrep_node_address = 127.0.0.1:$gport
wsrep_provider_options = "base_host=127.0.0.1;base_port=$gport;gmcast.listen_addr=tcp://127.0.0.1:$gport;ist.recv_addr=127.0.0.1:$((gport + 1));gcache.size=512M;evs.suspect_timeout=PT5S;evs.inactive_timeout=PT10S"
wsrep_sst_method = mysqldump
wsrep_sst_auth = root:
wsrep_sst_receive_address = 127.0.0.1:$port
wsrep_slave_threads = 2
EOF
}

# The position of the last transaction a stopped node applied, read from its InnoDB
# (what mysqld_safe does before a start): with it, a node whose data is as new as the
# cluster's joins without a state transfer, and one that is behind catches up from
# another node's write-set cache.
recovered_position() { # node
    local n=$1 log
    log="$dir/node$n/recover.log"
    as_root rm -f "$log"
    as_root /usr/sbin/mariadbd --defaults-file="$dir/node$n.cnf" --wsrep-recover \
        --log-error="$log" >/dev/null 2>&1 || true
    as_root sed -n 's/.*WSREP: Recovered position: *//p' "$log" | tail -n 1
}

start_node() { # node, extra mariadbd options...
    local n=$1; shift
    local position
    position=$(recovered_position "$n")
    [ -z "$position" ] || set -- "$@" --wsrep-start-position="$position"
    # Not start-stop-daemon: it takes the machine's own MariaDB for this node.
    as_root setsid /usr/sbin/mariadbd --defaults-file="$dir/node$n.cnf" "$@" \
        </dev/null >>"$dir/node$n/console.log" 2>&1 &
    wait_for "Galera node $n" ping_node "$n"
    # Synced: the node applies writes and serves reads of the cluster's state.
    wait_for "Galera node $n synced" bash -c \
        "mariadb --protocol=tcp -h 127.0.0.1 -P $(sql_port "$n") -u root -N -e \
         \"SHOW STATUS LIKE 'wsrep_local_state_comment'\" | grep -q Synced"
}

stop_node() { # node
    local n=$1
    if ping_node "$n" >/dev/null 2>&1; then
        mariadb-admin --protocol=tcp -h 127.0.0.1 -P "$(sql_port "$n")" -u root shutdown || true
    fi
    for _ in $(seq 1 60); do
        [ -f "$dir/node$n/mysqld.pid" ] && kill -0 "$(cat "$dir/node$n/mysqld.pid")" 2>/dev/null || return 0
        sleep 0.5
    done
}

kill_node() { # node
    local n=$1 pid
    pid=$(as_root cat "$dir/node$n/mysqld.pid" 2>/dev/null || true)
    [ -n "$pid" ] || return 0
    as_root kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2
    done
}

first_setup() {
    step "Galera: setting up node 1 in $dir"
    as_root mkdir -p "$dir/node1/data"
    as_root chown -R mysql:mysql "$dir"
    write_config 1
    as_root mariadb-install-db --defaults-file="$dir/node1.cnf" --auth-root-authentication-method=normal \
        --skip-test-db >/dev/null
    start_node 1 --wsrep-new-cluster
    as_root mariadb -S "$dir/node1/mysqld.sock" -u root -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
           GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
           CREATE DATABASE IF NOT EXISTS diesel_occ_test"
    stop_node 1
    for n in 2 3; do
        as_root rm -rf "$dir/node$n"
        as_root mkdir -p "$dir/node$n"
        as_root cp -a "$dir/node1/data" "$dir/node$n/data"
        write_config "$n"
    done
    as_root chown -R mysql:mysql "$dir"
}

start_cluster() {
    install_missing_packages
    dpkg-query -W -f='${Status}' galera-4 2>/dev/null | grep -q "install ok installed" || {
        step "installing galera-4"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq galera-4 >/dev/null
    }
    [ -d "$dir/node3/data" ] || first_setup
    for n in "${nodes[@]}"; do write_config "$n"; done
    local running=()
    for n in "${nodes[@]}"; do ping_node "$n" >/dev/null 2>&1 && running+=("$n"); done
    if [ ${#running[@]} -eq 0 ]; then
        step "Galera: bootstrapping the cluster from node 1"
        # Every node was shut down cleanly by this script, so node 1 is as new as any.
        as_root sed -i 's/^safe_to_bootstrap:.*/safe_to_bootstrap: 1/' "$dir/node1/data/grastate.dat"
        start_node 1 --wsrep-new-cluster
    fi
    for n in "${nodes[@]}"; do
        ping_node "$n" >/dev/null 2>&1 || { step "Galera: starting node $n"; start_node "$n"; }
    done
    local size
    size=$(sql 1 "SHOW STATUS LIKE 'wsrep_cluster_size'" | awk '{print $2}')
    [ "$size" = 3 ] || { echo "Galera: cluster size $size, not 3" >&2; exit 1; }
    step "Galera: 3 nodes synced: $(urls)"
}

case "${1:-start}" in
    start) start_cluster ;;
    stop) for n in 3 2 1; do stop_node "$n"; done ;;
    urls) urls ;;
    bounce) kill_node "${2:?bounce N: which node}"; start_node "$2" ;;
    *) echo "usage: $0 start|stop|urls|bounce N" >&2; exit 2 ;;
esac
