#!/bin/sh
# file-fence.sh TARGET < CONTENT: replaces the file TARGET with standard input only if this run's fencing
# token (REDCRON_FENCING_TOKEN) is above every token that has replaced it.
#
# How: the content goes to a temporary file beside TARGET first; then, holding an exclusive flock on
# TARGET.lock, the script reads the highest token seen (TARGET.fence), and only if this token is above it
# writes the new fence and renames the temporary file over TARGET. The check and the rename happen under
# one lock, so they are one step for every writer that takes it: a run that checked and was then paused
# still holds the lock, and a newer run waits for it instead of being overtaken. The fence is raised
# before the rename, so a crash in between leaves the old content under a raised fence (stale writers
# stay refused), never new content under an old fence. Readers see the old file or the new one whole
# (rename is atomic). Tokens are compared exactly as digit strings (length, then bytes), not with shell
# arithmetic, which stops at 2^63.
#
# Exit status: 0 written; 3 refused (a run with a higher token wrote first: this run is stale, TARGET
# unchanged); 1 anything else (no token, the lock not had within FENCE_LOCK_WAIT seconds, default 60).
#
# Limits: flock is advisory — only writers that go through this script (or take the same lock and
# check the same fence) are fenced. One local filesystem: TARGET, its .lock, .fence and temporary file
# in one directory (rename does not cross filesystems). NFS: Linux emulates flock with NFS byte-range
# locks, which are only as good as the server's lock manager, and a client that loses its lease (a
# long pause, a partition) loses the lock silently — do not rely on this over NFS. Durability: the
# content and the fence are fsynced (`sync FILE`, GNU coreutils), the directory is not; a machine crash
# can undo the last rename. An object store has no rename and no lock: there, use a conditional put
# (see README.md).
set -u
if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: file-fence.sh TARGET < CONTENT" >&2
    exit 1
fi
target=$1
token=${REDCRON_FENCING_TOKEN:-}
case $token in
'' | *[!0-9]*)
    echo "fence: REDCRON_FENCING_TOKEN is '$token', not a decimal integer (run this under redcron)" >&2
    exit 1
    ;;
esac

# without_zeros DIGITS: DIGITS without leading zeros ("0" for zero).
without_zeros() {
    set -- "${1#"${1%%[!0]*}"}"
    echo "${1:-0}"
}

# below A B: whether the decimal integer A is below B, exactly at any length: the shorter is smaller,
# equal lengths compare as bytes (C locale), which for digits is their numeric order.
below() {
    a=$(without_zeros "$1")
    b=$(without_zeros "$2")
    if [ "${#a}" -ne "${#b}" ]; then
        [ "${#a}" -lt "${#b}" ]
        return
    fi
    [ "$a" != "$b" ] && [ "$(printf '%s\n%s\n' "$a" "$b" | LC_ALL=C sort | sed -n 1p)" = "$a" ]
}

tmp=$(mktemp "$target.XXXXXX") || exit 1
trap 'rm -f "$tmp" "$tmp.fence"' EXIT
# mktemp makes the file private; TARGET gets the mode that `cat > TARGET` would give it.
chmod "$(printf '%o' $((0666 & ~$(umask))))" "$tmp" && cat >"$tmp" && sync "$tmp" || exit 1

exec 9>>"$target.lock" || exit 1
if ! flock -w "${FENCE_LOCK_WAIT:-60}" 9; then
    echo "fence: $target.lock not had within ${FENCE_LOCK_WAIT:-60} s" >&2
    exit 1
fi
fence=0
if [ -e "$target.fence" ]; then
    fence=$(cat "$target.fence") || exit 1
    case $fence in
    '' | *[!0-9]*)
        echo "fence: $target.fence holds '$fence', not a decimal integer" >&2
        exit 1
        ;;
    esac
fi
if [ -e "$target.fence" ] && ! below "$fence" "$token"; then
    echo "fence: refused: token $token is not above the fence $fence of $target (the run with that token wrote it: this run is stale)" >&2
    exit 3
fi
without_zeros "$token" >"$tmp.fence" && sync "$tmp.fence" && mv -f "$tmp.fence" "$target.fence" || exit 1
mv -f "$tmp" "$target" || exit 1
