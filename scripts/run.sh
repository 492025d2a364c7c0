#!/usr/bin/env bash
# `make run`: migrate, run the node, and write the development credentials file once the
# node serves it (orbit-admin bootstrap --when-ready, beside the node). Called by the
# Makefile with BIN (the venv's bin/), CREDENTIALS and READY_WAIT_S in the environment.
#
# This shell stays the parent of both the node and the bootstrap and waits for each, so
# the bootstrap is reaped when it ends (the node, which never starts processes, would
# leave it a zombie for its whole life), and so that when the node stops (Ctrl-C) it can
# say what it leaves running: the private MariaDB of scripts/devdb.sh, on purpose (it
# serves this checkout's `make test` and keeps the development data; starting it again
# costs seconds).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${BIN:?}" "${CREDENTIALS:?}" "${READY_WAIT_S:?}"

PRIVATE_DB=0
if [ -z "${ORBIT_MYSQL_DSN:-}" ]; then
  PRIVATE_DB=1
  ORBIT_MYSQL_DSN="$(scripts/devdb.sh dsn)"
fi
export ORBIT_MYSQL_DSN
mkdir -p var
"$BIN/orbit-migrate" up || exit

# Ctrl-C sends SIGINT to the whole process group: the node drains on it; this shell only
# waits for the node to finish. A SIGTERM (make passes the one it gets to this shell) is
# passed on to the node.
node=
trap : INT
trap '[ -n "$node" ] && kill -TERM "$node" 2>/dev/null' TERM
# A command started with `&` begins with SIGINT ignored; the node must get Ctrl-C as a
# command in the foreground would.
env --default-signal=INT "$BIN/orbit" &
node=$!
"$BIN/orbit-admin" bootstrap --application dev --namespace default --environment test --queue initial \
  --worker-access --output "$CREDENTIALS" --when-ready "$READY_WAIT_S" --node-pid "$node" &
bootstrap=$!

# `wait` returns early (above 128) when a trapped signal arrives; wait again until the
# node has ended (an ended node is a zombie until waited for, so `kill -0` still finds
# it), then once more for its status (bash keeps it).
while kill -0 "$node" 2>/dev/null; do
  wait "$node"
done
wait "$node"
status=$?
wait "$bootstrap"

if [ "$PRIVATE_DB" = 1 ] && scripts/devdb.sh status; then
  echo "make run: the node has stopped; the private MariaDB (scripts/devdb.sh) is still running at" \
    "$ORBIT_MYSQL_DSN: stop it with scripts/devdb.sh stop (its data stays in var/mariadb)," \
    "or make clean (which also deletes var/ and .venv/)" >&2
fi
exit "$status"
