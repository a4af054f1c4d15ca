#!/bin/sh
# mysql.sh RESOURCE VALUE: writes VALUE for RESOURCE in MySQL or MariaDB only if this run's fencing token
# (REDCRON_FENCING_TOKEN) raised RESOURCE's fence row in the same transaction (mysql.sql; the tables are
# mysql-schema.sql's).
#
# Exit status: 0 written; 3 refused (a run with a higher token wrote first: this run is stale, nothing
# written); 1 anything else (no token, the server unreachable, an SQL error).
# Connects with MYSQL_HOST, MYSQL_TCP_PORT, MYSQL_USER, MYSQL_DATABASE and MYSQL_PWD (the client reads
# the host, port and password itself), with the client MYSQL_CLIENT (default `mysql`; MariaDB's is also
# `mariadb`). RESOURCE and VALUE reach the server as hex literals, so no quoting can go wrong.
# Limits: those of mysql.sql — only writes gated on the fence are fenced.
set -u
here=$(dirname "$0")
if [ $# -ne 2 ] || [ -z "$1" ]; then
    echo "usage: mysql.sh RESOURCE VALUE" >&2
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
# DECIMAL(20, 0) holds every u64; a longer token would be clamped by CAST, so it is refused instead.
token=${token#"${token%%[!0]*}"}
token=${token:-0}
if [ "${#token}" -gt 20 ]; then
    echo "fence: REDCRON_FENCING_TOKEN has more than 20 digits" >&2
    exit 1
fi
hex() { printf '%s' "$1" | od -An -v -tx1 | tr -d ' \n'; }
status=$(
    {
        printf "SET @resource = CONVERT(X'%s' USING utf8mb4);\n" "$(hex "$resource")"
        printf "SET @value = CONVERT(X'%s' USING utf8mb4);\n" "$(hex "$value")"
        printf "SET @token = CAST('%s' AS DECIMAL(20, 0));\n" "$token"
        cat "$here/mysql.sql"
    } | "${MYSQL_CLIENT:-mysql}" --batch --skip-column-names ${MYSQL_USER:+"--user=$MYSQL_USER"} \
        ${MYSQL_DATABASE:+"--database=$MYSQL_DATABASE"}
) || exit 1
case $status in
written) exit 0 ;;
refused)
    echo "fence: refused: token $token is not above the fence of $resource (a run with this token or a higher one wrote it: this run is stale)" >&2
    exit 3
    ;;
*)
    echo "fence: ${MYSQL_CLIENT:-mysql} answered: $status" >&2
    exit 1
    ;;
esac
