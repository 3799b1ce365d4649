#!/usr/bin/env bash
# A throwaway PostgreSQL 15 for tests and benchmarks (CI, developers): its own cluster on
# its own port, so it never touches the distribution's default cluster. Run as root;
# rerunnable (does nothing when it already runs). Prints the DATABASE_URL to use.
#
#   scripts/postgres.sh start    # initdb (first time) + start; prints the URL
#   scripts/postgres.sh stop
#   scripts/postgres.sh url
#
# Settings (environment): PGBIN (/usr/lib/postgresql/15/bin), PGDATA (/var/tmp/yoloportal-pg),
# PGPORT (5433), PGROLE/PGPASSWORD (yoloportal/yoloportal).
#
# Durability is switched off (fsync, synchronous_commit, full_page_writes): this cluster
# holds test data only and is rebuilt at will. Never use these settings for real data;
# docs/deploy.md describes a production PostgreSQL.
set -euo pipefail
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
PGDATA=${PGDATA:-/var/tmp/yoloportal-pg}
PGPORT=${PGPORT:-5433}
PGROLE=${PGROLE:-yoloportal}
PGPASSWORD=${PGPASSWORD:-yoloportal}
URL="postgres://$PGROLE:$PGPASSWORD@127.0.0.1:$PGPORT/$PGROLE"

as_postgres() { su -s /bin/sh postgres -c "$*"; }

start() {
  if [ ! -x "$PGBIN/initdb" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >/dev/null
  fi
  if [ ! -f "$PGDATA/PG_VERSION" ]; then
    mkdir -p "$PGDATA"
    chown postgres:postgres "$PGDATA"
    chmod 700 "$PGDATA"
    # initdb refuses to run as root: the cluster belongs to the postgres user.
    as_postgres "'$PGBIN/initdb' -D '$PGDATA' -U postgres --auth-local=peer --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null"
    cat >>"$PGDATA/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PGPORT
unix_socket_directories = '/tmp'
max_connections = 300
shared_buffers = 256MB
fsync = off
synchronous_commit = off
full_page_writes = off
CONF
  fi
  if ! as_postgres "'$PGBIN/pg_ctl' -D '$PGDATA' status" >/dev/null 2>&1; then
    as_postgres "'$PGBIN/pg_ctl' -D '$PGDATA' -l '$PGDATA/server.log' -w -t 60 start" >/dev/null
  fi
  as_postgres "'$PGBIN/psql' -h /tmp -p $PGPORT -U postgres -q -v ON_ERROR_STOP=1 -d postgres" <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PGROLE') THEN
    CREATE ROLE $PGROLE LOGIN CREATEDB PASSWORD '$PGPASSWORD';
  END IF;
END \$\$;
SELECT 'CREATE DATABASE $PGROLE OWNER $PGROLE' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$PGROLE')\gexec
SQL
  echo "$URL"
}

stop() {
  if [ -f "$PGDATA/PG_VERSION" ]; then
    as_postgres "'$PGBIN/pg_ctl' -D '$PGDATA' -m fast -w stop" >/dev/null 2>&1 || true
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  url) echo "$URL" ;;
  *) echo "usage: $0 start|stop|url" >&2; exit 2 ;;
esac
