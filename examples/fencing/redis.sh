#!/bin/sh
# redis.sh RESOURCE VALUE: sets RESOURCE's value in Redis to VALUE only if this run's fencing token
# (REDCRON_FENCING_TOKEN) is above every token that has written it; the check and the write are one
# script (redis-fence.lua), which Redis runs atomically.
#
# Exit status: 0 written; 3 refused (a run with a higher token wrote first: this run is stale, nothing
# changed); 1 anything else (no token, Redis unreachable, an error answer).
# Connects to REDIS_URL (redis://[user[:password]@]host[:port][/db], default redis://127.0.0.1:6379), or
# give the password in REDISCLI_AUTH instead of the URL. The keys are {RESOURCE}:fence and
# {RESOURCE}:value (one hash tag: one node of a Redis Cluster holds both).
# Limits: those of redis-fence.lua — only writes through it are fenced; a lost fence fences nothing.
set -u
here=$(dirname "$0")
if [ $# -ne 2 ] || [ -z "$1" ]; then
    echo "usage: redis.sh RESOURCE VALUE" >&2
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
script=$(cat "$here/redis-fence.lua") || exit 1
answer=$(redis-cli --no-auth-warning -u "${REDIS_URL:-redis://127.0.0.1:6379}" \
    EVAL "$script" 2 "{$resource}:fence" "{$resource}:value" "$token" "$value") || exit 1
# redis-cli answers an array as one element per line (not a terminal: raw), an error as its text.
status=$(printf '%s\n' "$answer" | sed -n 1p)
fence=$(printf '%s\n' "$answer" | sed -n 2p)
case $status in
1) exit 0 ;;
0)
    echo "fence: refused: token $token is not above the fence $fence of $resource (the run with that token wrote it: this run is stale)" >&2
    exit 3
    ;;
*)
    echo "fence: redis answered: $answer" >&2
    exit 1
    ;;
esac
