# The servers the tests need, sourced by scripts/test.sh and scripts/faults.sh.
#
# Run as root on a Debian machine (or with sudo available). `prepare_servers` installs what
# is missing (postgresql, mariadb-server, libpq-dev, default-libmysqlclient-dev,
# pkg-config), starts the servers if they are down, creates the test databases and exports
# PG_DATABASE_URL / MYSQL_DATABASE_URL. It is idempotent. Preset URLs are used as given and
# the local servers are left alone.

step() { printf '\n==> [%ss] %s\n' "$SECONDS" "$*"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

install_missing_packages() {
    local missing=()
    for pkg in postgresql mariadb-server libpq-dev default-libmysqlclient-dev pkg-config procps; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        step "installing ${missing[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

wait_for() { # description, command...
    wait_within 30 "$@"
}

wait_within() { # seconds, description, command...
    local seconds=$1 what=$2; shift 2
    for _ in $(seq 1 $((seconds * 2))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
    echo "error: $what did not come up within $seconds s" >&2
    return 1
}

# Installs those of the Debian packages named that are missing (the package lists are
# refreshed first, once).
ensure_packages() { # package...
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    step "installing ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Whether the process whose pid is in file $1 runs.
pid_running() { # pid file
    as_root test -f "$1" && as_root kill -0 "$(as_root cat "$1")" 2>/dev/null
}

# Sends signal $2 to the process whose pid is in file $1 and waits until it has ended
# (SIGKILL after 10 s).
stop_pid() { # pid file, signal
    pid_running "$1" || return 0
    local pid
    pid=$(as_root cat "$1")
    as_root kill "-$2" "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do as_root kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    as_root kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do as_root kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
}

start_postgres() {
    if ! pg_isready -q -h 127.0.0.1 -p 5432; then
        step "starting PostgreSQL"
        local version
        version=$(ls /etc/postgresql | sort -V | tail -n 1)
        as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start
        wait_for "PostgreSQL" pg_isready -q -h 127.0.0.1 -p 5432
    fi
    if ! psql -h 127.0.0.1 -U postgres -d postgres -Atc 'SELECT 1' >/dev/null 2>&1; then
        step "allowing user postgres over 127.0.0.1 without a password (test machine)"
        local hba
        hba=$(as_root runuser -u postgres -- psql -Atc 'SHOW hba_file')
        as_root sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
        as_root runuser -u postgres -- psql -qc 'SELECT pg_reload_conf()'
        wait_for "PostgreSQL trust login" psql -h 127.0.0.1 -U postgres -d postgres -Atc 'SELECT 1'
    fi
    psql -h 127.0.0.1 -U postgres -d postgres -Atc \
        "SELECT 1 FROM pg_database WHERE datname = 'diesel_occ_test'" | grep -q 1 ||
        psql -h 127.0.0.1 -U postgres -d postgres -qc 'CREATE DATABASE diesel_occ_test'
}

start_mariadb() {
    if ! mariadb-admin ping >/dev/null 2>&1; then
        step "starting MariaDB"
        start_mariadbd
    fi
    if ! mariadb -h 127.0.0.1 -u root -e 'SELECT 1' >/dev/null 2>&1; then
        step "allowing root over 127.0.0.1 with an empty password (test machine)"
        as_root mariadb -u root -e "
            ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
            CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
            GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
            FLUSH PRIVILEGES;"
    fi
    mariadb -h 127.0.0.1 -u root -e 'CREATE DATABASE IF NOT EXISTS diesel_occ_test'
}

prepare_servers() {
    install_missing_packages
    if [ -z "${PG_DATABASE_URL:-}" ]; then
        start_postgres
        export PG_DATABASE_URL=postgres://postgres@127.0.0.1:5432/diesel_occ_test
    fi
    if [ -z "${MYSQL_DATABASE_URL:-}" ]; then
        start_mariadb
        export MYSQL_DATABASE_URL=mysql://root@127.0.0.1:3306/diesel_occ_test
    fi
}

# A fast restart of the local PostgreSQL (open sessions are ended), back when it answers.
restart_postgres() {
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main restart -m fast
    wait_for "PostgreSQL" pg_isready -q -h 127.0.0.1 -p 5432
}

# A shutdown and start of the local MariaDB, back when it answers.
restart_mariadb() {
    local pid
    pid=$(cat "$mariadb_pid" 2>/dev/null || true)
    as_root mariadb-admin shutdown
    # Gone when its process has ended (or, without a pid file, when it stops answering).
    for _ in $(seq 1 60); do
        if [ -n "$pid" ]; then kill -0 "$pid" 2>/dev/null || break
        else mariadb-admin ping >/dev/null 2>&1 || break; fi
        sleep 0.5
    done
    start_mariadbd
}

# The machine's own MariaDB, told apart from other mariadbd processes (the Galera test
# nodes of scripts/galera.sh) by its pid file.
mariadb_pid=/run/mysqld/mysqld.pid
start_mariadbd() {
    as_root mkdir -p /run/mysqld
    as_root chown mysql:mysql /run/mysqld
    as_root start-stop-daemon --start --oknodo --background --pidfile "$mariadb_pid" \
        --exec /usr/sbin/mariadbd -- --user=mysql --pid-file="$mariadb_pid"
    wait_for "MariaDB" mariadb-admin ping
}

# The start of a test bed's HAProxy configuration: a daemon with its pid file and admin
# socket in folder $1, TCP proxying, and idle timeouts above the databases' own (idle
# sessions are the database's business, not the proxy's).
haproxy_head() { # folder
    cat <<EOF
global
    pidfile $1/haproxy.pid
    stats socket $1/admin.sock mode 600 level admin
    daemon

defaults
    mode tcp
    timeout connect 2s
    timeout client 1h
    timeout server 1h

EOF
}
