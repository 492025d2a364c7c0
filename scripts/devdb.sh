#!/usr/bin/env bash
# A private MariaDB for development and tests under ./var/mariadb (never the shared server).
#   scripts/devdb.sh start   initialise if needed, start if not running, wait until it answers
#   scripts/devdb.sh stop    stop it
#   scripts/devdb.sh status  exit 0 if it is running and answers, 1 if not
#   scripts/devdb.sh dsn     print its DSN
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD/var/mariadb"
# Each checkout gets its own port (derived from its path) so clones never collide.
PORT="${ORBIT_DEV_DB_PORT:-$((33306 + $(printf %s "$ROOT" | cksum | cut -d" " -f1) % 2000))}"
SOCK="$ROOT/mysqld.sock"
DSN="mysql://root@127.0.0.1:${PORT}/orbit"

find_bin() {
  for name in "$@"; do
    for dir in /usr/sbin /usr/bin /usr/local/sbin /usr/local/bin; do
      [ -x "$dir/$name" ] && { echo "$dir/$name"; return 0; }
    done
    command -v "$name" 2>/dev/null && return 0
  done
  return 1
}

ensure_installed() {
  if find_bin mariadbd mysqld >/dev/null; then return 0; fi
  if command -v apt-get >/dev/null 2>&1; then
    echo "mariadbd not found: installing the Debian mariadb-server package" >&2
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mariadb-server >/dev/null
  else
    echo "error: mariadbd is not installed and apt-get is not available; install MariaDB 10.6+ or set ORBIT_MYSQL_DSN" >&2
    exit 1
  fi
}

# The Galera fault test (tests/system/test_fault_galera.py) needs the provider and rsync (its state
# transfer); installed like mariadb-server, best effort: without them that test is skipped.
ensure_galera() {
  if [ -e /usr/lib/galera/libgalera_smm.so ] && command -v rsync >/dev/null 2>&1; then return 0; fi
  command -v apt-get >/dev/null 2>&1 || return 0
  echo "galera-4 or rsync not found: installing the Debian galera-4 and rsync packages" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq galera-4 rsync >/dev/null; } \
    || echo "warning: could not install galera-4/rsync; the Galera fault test will be skipped" >&2
}

answers() {
  "$(find_bin mariadb-admin mysqladmin)" --no-defaults -uroot --socket="$SOCK" ping >/dev/null 2>&1
}

start() {
  ensure_installed
  ensure_galera
  # Its own tmpdir: internal temporary tables never depend on what else uses /tmp.
  mkdir -p "$ROOT/tmp"
  if answers; then echo "$DSN"; return 0; fi
  if [ ! -d "$ROOT/data/mysql" ]; then
    rm -rf "$ROOT/data"
    "$(find_bin mariadb-install-db mysql_install_db)" --no-defaults --datadir="$ROOT/data" \
      --tmpdir="$ROOT/tmp" --auth-root-authentication-method=normal --skip-test-db --user="$(id -un)" >"$ROOT/install.log" 2>&1 \
      || { echo "error: mariadb-install-db failed, see $ROOT/install.log" >&2; exit 1; }
  fi
  # Development/test settings: durability is relaxed (flush once a second) because a
  # lost dev database costs nothing; production needs innodb_flush_log_at_trx_commit=1.
  "$(find_bin mariadbd mysqld)" --no-defaults --datadir="$ROOT/data" --socket="$SOCK" \
    --port="$PORT" --bind-address=127.0.0.1 --pid-file="$ROOT/mariadbd.pid" --log-error="$ROOT/error.log" \
    --tmpdir="$ROOT/tmp" \
    --user="$(id -un)" --innodb-flush-log-at-trx-commit=2 --innodb-buffer-pool-size=512M \
    --max-connections=1000 --skip-name-resolve --innodb-lock-wait-timeout=10 >/dev/null 2>&1 &
  for _ in $(seq 1 120); do
    if answers; then
      "$(find_bin mariadb mysql)" --no-defaults -uroot --socket="$SOCK" -e "CREATE DATABASE IF NOT EXISTS orbit"
      echo "$DSN"; return 0
    fi
    sleep 0.5
  done
  echo "error: private MariaDB did not start; see $ROOT/error.log" >&2
  exit 1
}

stop() {
  if answers; then "$(find_bin mariadb-admin mysqladmin)" --no-defaults -uroot --socket="$SOCK" shutdown; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  dsn) echo "$DSN" ;;
  status) answers ;;
  *) echo "usage: $0 start|stop|status|dsn" >&2; exit 2 ;;
esac
