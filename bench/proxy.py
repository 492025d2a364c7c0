"""A TCP proxy that delays what a client sends by a fixed time (``python -m bench.proxy``).

It listens on 127.0.0.1 (a free port), forwards every connection to ``--target`` and
holds each chunk the client sends for ``--delay-ms`` before passing it on (with
``--only TEXT``: only chunks that contain TEXT, e.g. one statement's index hint); the
answers go back at once. In front of MariaDB those statements then take ``--delay-ms``
longer, without limiting how many run at once: chunks are delayed, not queued behind
each other, and a connection's chunks keep their order. S4 gives a node this address in
its DSN to make its claim SQL slow. It writes ``{"port": ...}`` to ``--ready`` once it
listens; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from orbit_node.domain.dsn import Dsn

from .processes import ready_process

# Bounds on the proxy process's start and stop.
PROXY_START_TIMEOUT_S = 10
PROXY_STOP_TIMEOUT_S = 5
READ_SIZE = 65536


async def _forward(source: trio.abc.Stream, sink: trio.abc.Stream, delay_s: float, only: bytes | None) -> None:
    """Copy ``source`` to ``sink`` in order, a chunk (containing ``only``) ``delay_s`` after it arrived."""
    send, receive = trio.open_memory_channel(math.inf)

    async def writer() -> None:
        async for due, chunk in receive:
            await trio.sleep_until(due)
            await sink.send_all(chunk)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        async with send:
            while chunk := await source.receive_some(READ_SIZE):
                delayed = only is None or only in chunk
                send.send_nowait((trio.current_time() + (delay_s if delayed else 0.0), chunk))


async def _relay(client: trio.SocketStream, host: str, port: int, delay_s: float, only: bytes | None) -> None:
    try:
        server = await trio.open_tcp_stream(host, port)
    except OSError:
        await client.aclose()
        return
    async with client, server:
        # Either side closing (or failing) ends both directions.
        async with trio.open_nursery() as nursery:

            async def one_way(source, sink, delay, match):
                try:
                    await _forward(source, sink, delay, match)
                except Exception:  # the peer closed or reset (alone or in a group): end both ways
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(one_way, client, server, delay_s, only)
            nursery.start_soon(one_way, server, client, 0.0, None)


async def serve(target_host: str, target_port: int, delay_s: float, only: bytes | None, ready: Path) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    tmp = ready.with_suffix(".tmp")
    tmp.write_text(json.dumps({"port": port}))
    tmp.replace(ready)

    async def handler(stream: trio.SocketStream) -> None:
        try:
            await _relay(stream, target_host, target_port, delay_s, only)
        except Exception:  # one connection's failure never stops the proxy
            pass

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, handler, listeners)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                return


@asynccontextmanager
async def delayed_dsn(dsn: Dsn, delay_ms: float, *, only: str | None = None) -> AsyncIterator[Dsn]:
    """``dsn`` through a proxy process that delays every statement (with ``only``: every
    statement whose text contains it) by ``delay_ms``."""
    if dsn.unix_socket is not None:
        raise SystemExit("the delay proxy needs a TCP DSN (host and port), not a unix socket")
    workdir = Path(tempfile.mkdtemp(prefix="orbit-bench-proxy-"))
    ready = workdir / "ready.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.proxy",
        "--target",
        f"{dsn.host}:{dsn.port}",
        "--delay-ms",
        str(delay_ms),
        "--ready",
        str(ready),
    ]
    if only is not None:
        cmd += ["--only", only]
    try:
        async with ready_process(
            cmd, ready, name="proxy", start_timeout_s=PROXY_START_TIMEOUT_S, stop_timeout_s=PROXY_STOP_TIMEOUT_S
        ) as (_, info):
            yield attrs.evolve(dsn, host="127.0.0.1", port=info["port"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy")
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to (127.0.0.1 only)")
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--only", help="delay only chunks that contain this text (default: every chunk)")
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"the proxy only forwards to this machine, not {host}")
    only = args.only.encode() if args.only else None
    trio.run(serve, host, int(port), args.delay_ms / 1000.0, only, args.ready)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
