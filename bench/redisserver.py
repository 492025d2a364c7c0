"""A private Redis for the Redis peers (Celery, Dramatiq): Debian's ``redis-server`` on a
port of its own, with its own temporary directory, never the shared 127.0.0.1:6379 one.

It keeps every write in its append-only file (``appendonly yes``), fsynced as the run's
durability says (``appendfsync always`` at production durability, where Orbit's MariaDB
flushes at every commit; ``everysec`` at the development setting), and takes no RDB
snapshots. A new server for every peer run: each starts on an empty store, as each
PostgreSQL peer run gets a new database.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from harness.mariadb import find_bin
from harness.nodeproc import free_port
from harness.processes import stop_process

# Bound on the server's start (it answers within milliseconds) and on its stop.
START_TIMEOUT_S = 20
STOP_TIMEOUT_S = 20
# What redis-server answers to PING once it accepts commands.
PONG = b"+PONG\r\n"


def server_args(directory: Path, port: int, appendfsync: str) -> list[str]:
    """``redis-server``'s options: loopback only, its own directory, the append-only file
    fsynced per ``appendfsync`` (``always`` or ``everysec``), no RDB snapshots."""
    if appendfsync not in ("always", "everysec"):
        raise ValueError(f"appendfsync {appendfsync!r}: always or everysec expected")
    return [
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--dir",
        str(directory),
        "--appendonly",
        "yes",
        "--appendfsync",
        appendfsync,
        "--save",
        "",
        "--daemonize",
        "no",
        "--logfile",
        str(directory / "redis.log"),
    ]


async def _answers_ping(port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return False
    async with stream:
        await stream.send_all(b"PING\r\n")
        return await stream.receive_some(64) == PONG


@asynccontextmanager
async def private_redis(appendfsync: str) -> AsyncIterator[str]:
    """A new ``redis-server`` for the block; yields its URL (database 0). Stopped (SIGTERM,
    then SIGKILL) and its directory removed on exit."""
    directory = Path(tempfile.mkdtemp(prefix="orbit-redis-"))
    port = free_port()
    proc = await trio.lowlevel.open_process(
        [find_bin("redis-server"), *server_args(directory, port, appendfsync)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(START_TIMEOUT_S):
            while not await _answers_ping(port):
                if proc.poll() is not None:
                    log = directory / "redis.log"
                    tail = log.read_text(errors="replace")[-400:] if log.exists() else ""
                    raise RuntimeError(f"redis-server exited with status {proc.returncode}: {tail}")
                await trio.sleep(0.02)  # bounded poll: the server says nothing else when it is up
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        with trio.CancelScope(shield=True):
            await stop_process(proc, STOP_TIMEOUT_S)
        shutil.rmtree(directory, ignore_errors=True)
