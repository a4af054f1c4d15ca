#!/bin/sh
# postgres.sh RESOURCE VALUE: writes VALUE for RESOURCE in PostgreSQL in a transaction that commits only
# if this run's fencing token (REDCRON_FENCING_TOKEN) raised RESOURCE's fence row (postgres.sql; the
# tables are postgres-schema.sql's).
#
# Exit status: 0 written; 3 refused (a run with a higher token wrote first: this run is stale, nothing
# committed); 1 anything else (no token, the server unreachable, an SQL error).
# Connects as psql does: PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD (or ~/.pgpass), PGSSLMODE, ….
# Limits: those of postgres.sql — only writes in a transaction that raised the fence are fenced.
set -u
here=$(dirname "$0")
if [ $# -ne 2 ] || [ -z "$1" ]; then
    echo "usage: postgres.sh RESOURCE VALUE" >&2
    exit 1
fi
resource=$1
value=$2
token=${REDCRON_FENCING_TOKEN:-}
case $token in
'' | *[!0-9]*)
    echo "fence: REDCRON_FENCING_TOKEN is '$token', not a decimal integer (run this under redcron)" >&2
    exit 1
    ;;
esac
status=$(psql -X -q -t -A -v ON_ERROR_STOP=1 -v resource="$resource" -v value="$value" \
    -v token="$token" -f "$here/postgres.sql") || exit 1
case $status in
written) exit 0 ;;
refused)
    echo "fence: refused: token $token is not above the fence of $resource (a run with this token or a higher one wrote it: this run is stale)" >&2
    exit 3
    ;;
*)
    echo "fence: psql answered: $status" >&2
    exit 1
    ;;
esac
