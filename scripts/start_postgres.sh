#!/usr/bin/env bash
# Test set-up: a throw-away PostgreSQL server on loopback for the reliability tests and benchmark.
#
# Installs Debian's postgresql package when no server binaries are found (apt-get; needs root),
# initialises a private cluster in $CUBIC_PG_DIR (default /tmp/cubic-pg), starts it listening on
# 127.0.0.1:$CUBIC_PG_PORT (default 55432) only, creates role and database "cubic" with a
# password, and prints the SQLAlchemy URL on stdout. Idempotent: a running server is reused.
# Exit 0 with the URL, or non-zero with one line on stderr saying why PostgreSQL cannot be had
# (the tests then skip with that reason).
set -uo pipefail

DIR="${CUBIC_PG_DIR:-/tmp/cubic-pg}"
PORT="${CUBIC_PG_PORT:-55432}"
PASSWORD="${CUBIC_PG_PASSWORD:-cubic-test-pw}"
URL="postgresql+psycopg2://cubic:${PASSWORD}@127.0.0.1:${PORT}/cubic"

fail() { echo "start_postgres: $*" >&2; exit 1; }

find_bin() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  command -v initdb >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return 0; }
  return 1
}

BIN="$(find_bin)"
if [ -z "$BIN" ]; then
  [ "$(id -u)" = 0 ] || fail "PostgreSQL is not installed and installing it needs root"
  command -v apt-get >/dev/null 2>&1 || fail "PostgreSQL is not installed and there is no apt-get"
  export DEBIAN_FRONTEND=noninteractive
  (apt-get install -y -q postgresql >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 &&
    apt-get install -y -q postgresql >/dev/null 2>&1; }) || fail "apt-get install postgresql failed"
  BIN="$(find_bin)" || fail "postgresql installed but initdb not found"
fi

# PostgreSQL refuses to run as root: run the server as the unprivileged 'postgres' user when root.
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres >/dev/null 2>&1 \
    || fail "no 'postgres' user to run the server as"
  AS=(runuser -u postgres --)
else
  AS=()
fi

mkdir -p "$DIR" || fail "cannot create $DIR"
[ "$(id -u)" = 0 ] && chown postgres "$DIR"
chmod 700 "$DIR"

if ! "${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
  if [ ! -s "$DIR/data/PG_VERSION" ]; then
    PWFILE="$DIR/pw"
    printf '%s\n' "$PASSWORD" >"$PWFILE"
    [ "$(id -u)" = 0 ] && chown postgres "$PWFILE"
    # the superuser (cubic) authenticates with a password over TCP; the socket stays private to the owner
    "${AS[@]}" "$BIN/initdb" -D "$DIR/data" -U cubic --pwfile="$PWFILE" --auth-host=scram-sha-256 \
      --auth-local=peer >"$DIR/initdb.log" 2>&1 || fail "initdb failed (see $DIR/initdb.log)"
    rm -f "$PWFILE"
  fi
  "${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DIR -c max_connections=100 -c fsync=on" start \
    >/dev/null 2>&1 || fail "the server did not start (see $DIR/server.log)"
fi

# the database (created once; 'cubic' is the superuser created by initdb)
if ! PGPASSWORD="$PASSWORD" psql -h 127.0.0.1 -p "$PORT" -U cubic -d cubic -Atc 'select 1' >/dev/null 2>&1; then
  PGPASSWORD="$PASSWORD" psql -h 127.0.0.1 -p "$PORT" -U cubic -d postgres -Atc 'create database cubic' \
    >/dev/null 2>&1 || fail "cannot create database cubic on 127.0.0.1:$PORT"
fi
echo "$URL"
