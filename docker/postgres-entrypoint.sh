#!/bin/sh
# The joule-postgres image's entrypoint (docker/Dockerfile.postgres). On an empty $PGDATA:
# initdb (scram-sha-256 for TCP, peer on the socket), the role `joule` with the password
# from $POSTGRES_PASSWORD_FILE (default /run/secrets/postgres_password) and its database
# `joule`. Then PostgreSQL in the foreground on 127.0.0.1:$POSTGRES_PORT (--listen ADDR to
# serve another address). Exit 1 with one line when the password file is missing or empty.
set -eu
bin=/usr/lib/postgresql/15/bin
listen=127.0.0.1
for arg in "$@"; do
  case "$arg" in
    --port=*) POSTGRES_PORT=${arg#--port=} ;;
    --listen=*) listen=${arg#--listen=} ;;
    *) echo "joule-postgres: unknown argument $arg (--port=N, --listen=ADDR)" >&2; exit 2 ;;
  esac
done
port=${POSTGRES_PORT:-5432}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pw_file=${POSTGRES_PASSWORD_FILE:-/run/secrets/postgres_password}
  if [ ! -s "$pw_file" ]; then
    echo "joule-postgres: no password in $pw_file (deploy/make-secrets.sh makes it)" >&2
    exit 1
  fi
  "$bin/initdb" -D "$PGDATA" -U postgres -E UTF8 --auth-local=peer \
    --auth-host=scram-sha-256 >/dev/null
  "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses='' -k /tmp" -w start >/dev/null
  # The password travels on psql's standard input, never on a command line.
  { printf '\\set pw `cat %s`\n' "$pw_file"
    echo "CREATE ROLE joule LOGIN PASSWORD :'pw';"
    echo "CREATE DATABASE joule OWNER joule;"; } |
    "$bin/psql" -q -v ON_ERROR_STOP=1 -h /tmp -U postgres -d postgres >/dev/null
  "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
  echo "joule-postgres: made the database joule (role joule) in $PGDATA"
fi
exec "$bin/postgres" -D "$PGDATA" -c "listen_addresses=$listen" -p "$port" -k /tmp
