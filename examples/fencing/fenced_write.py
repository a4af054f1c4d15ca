#!/usr/bin/env python3
"""fenced_write.py RESOURCE VALUE: a job written as a program, whose write to Redis is fenced.

Sets RESOURCE's value to VALUE only if this run's fencing token (REDCRON_FENCING_TOKEN) is above every
token that has written it. The check and the write are one call of redis-fence.lua (beside this file),
which Redis runs atomically: checking first and writing after, in two calls, would let a stale run's
write land between another run's check and its write. The token stays a string of digits end to end,
never a float.

Exit status: 0 written; 3 refused (a run with a higher token wrote first: this run is stale, nothing
changed); 1 anything else. Connects to REDIS_URL (redis://[user[:password]@]host[:port][/db], default
redis://127.0.0.1:6379; no TLS). Standard library only: a minimal RESP client, enough for AUTH, SELECT
and EVAL. The keys are {RESOURCE}:fence and {RESOURCE}:value, as redis.sh writes them.

Limits: those of redis-fence.lua — only writes through it are fenced; a lost fence fences nothing.
"""

import os
import socket
import sys
import urllib.parse
from pathlib import Path

WRITTEN, FAILED, REFUSED = 0, 1, 3
TIMEOUT_SECONDS = 10


class RedisError(Exception):
    """An error answer of the server, or an answer this client does not understand."""


def encode(*args: str) -> bytes:
    """A command as RESP: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def read_reply(stream):
    """One RESP2 reply: a string, an integer, None, or a list of those."""
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise RedisError("the connection closed mid-answer")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body.decode()
    if kind == b"-":
        raise RedisError(body.decode(errors="replace"))
    if kind == b":":
        return int(body)
    if kind == b"$":
        length = int(body)
        if length < 0:
            return None
        data = stream.read(length + 2)
        return data[:-2].decode(errors="replace")
    if kind == b"*":
        count = int(body)
        return None if count < 0 else [read_reply(stream) for _ in range(count)]
    raise RedisError(f"unexpected answer {line!r}")


def connect(url: str):
    """A connection to `url`, logged in and on its database: (socket, reader)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "redis":
        raise RedisError(f"REDIS_URL must be redis://… (got scheme {parsed.scheme!r})")
    sock = socket.create_connection(
        (parsed.hostname or "127.0.0.1", parsed.port or 6379), timeout=TIMEOUT_SECONDS
    )
    stream = sock.makefile("rb")

    def call(*args: str):
        sock.sendall(encode(*args))
        return read_reply(stream)

    if parsed.password is not None:
        password = urllib.parse.unquote(parsed.password)
        if parsed.username:
            call("AUTH", urllib.parse.unquote(parsed.username), password)
        else:
            call("AUTH", password)
    database = parsed.path.lstrip("/")
    if database:
        call("SELECT", database)
    return call


def main(argv) -> int:
    if len(argv) != 3:
        print("usage: fenced_write.py RESOURCE VALUE", file=sys.stderr)
        return FAILED
    resource, value = argv[1], argv[2]
    token = os.environ.get("REDCRON_FENCING_TOKEN", "")
    if not token.isascii() or not token.isdigit():
        print(f"fence: REDCRON_FENCING_TOKEN is {token!r}, not a decimal integer", file=sys.stderr)
        return FAILED
    script = (Path(__file__).resolve().parent / "redis-fence.lua").read_text()
    try:
        call = connect(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
        written, fence = call(
            "EVAL", script, "2", f"{{{resource}}}:fence", f"{{{resource}}}:value", token, value
        )
    except (OSError, RedisError, ValueError) as e:
        message = str(e)
        print(message if message.startswith("fence: ") else f"fence: {message}", file=sys.stderr)
        return FAILED
    if written == 1:
        return WRITTEN
    print(
        f"fence: refused: token {token} is not above the fence {fence} of {resource} "
        "(the run with that token wrote it: this run is stale)",
        file=sys.stderr,
    )
    return REFUSED


if __name__ == "__main__":
    sys.exit(main(sys.argv))
