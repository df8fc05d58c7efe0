#!/bin/sh
# First start: create the cluster, the user (password from POSTGRES_PASSWORD) and the database;
# every start: run the server in the foreground, listening on all interfaces with password auth.
set -eu
bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  "$bindir/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust \
    --auth-host=scram-sha-256 --encoding=UTF8 >/dev/null
  rm -f "$pwfile"
  echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "host all all ::/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  "$bindir/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  if [ "$POSTGRES_DB" != "postgres" ]; then
    "$bindir/psql" -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres \
      -c "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"$POSTGRES_USER\"" >/dev/null
  fi
  "$bindir/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
  echo "pg-entrypoint: initialised $PGDATA (database $POSTGRES_DB, user $POSTGRES_USER)"
fi

exec "$bindir/postgres" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql
