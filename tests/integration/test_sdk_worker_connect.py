"""The SDK Worker's connection failures: each is bounded, named in the log, and retried
with backoff like a lost connection (a node that never welcomes, a node that is not there)."""

from __future__ import annotations

import json
import logging
import socket

import pytest
import trio
from trio_websocket import WebSocketRequest, serve_websocket

from orbit_sdk import Worker

QUEUE_ID = "a" * 32


def worker_for(url: str, **kwargs) -> Worker:
    worker = Worker(url, "orb_test", [QUEUE_ID], **kwargs)
    worker.register("h", "v1", "v1", lambda task: None)
    return worker


def reconnect_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "orbit.sdk.worker" and "reconnecting" in r.getMessage()]


def test_the_welcome_timeout_is_a_positive_number_of_seconds():
    for bad in (0, -1.0, "10", True):
        with pytest.raises(ValueError, match="welcome_timeout_s"):
            Worker("http://x", "t", [QUEUE_ID], welcome_timeout_s=bad)  # type: ignore[arg-type]
    assert Worker("http://x", "t", [QUEUE_ID], welcome_timeout_s=2).welcome_timeout_s == 2


async def test_a_node_that_accepts_and_never_welcomes_is_a_lost_connection_retried(autojump_clock, caplog):
    """A server that accepts the WebSocket, reads the hello and answers nothing: after
    ``welcome_timeout_s`` the Worker drops the connection, says why, and dials again with
    backoff (before the bound, ``run`` waited for the welcome for ever)."""
    caplog.set_level(logging.WARNING, logger="orbit.sdk.worker")
    hellos: list[float] = []

    async def never_welcomes(request: WebSocketRequest) -> None:
        ws = await request.accept()
        assert json.loads(await ws.get_message())["type"] == "hello"
        hellos.append(trio.current_time())
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, never_welcomes, "127.0.0.1", 0, None)
        worker = worker_for(f"http://127.0.0.1:{server.port}", welcome_timeout_s=5.0)
        nursery.start_soon(worker.run)
        with trio.fail_after(60):  # of the mock clock: many times the bound and the backoff
            while len(hellos) < 3:
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    # Each connection waited for its welcome for the bound, then the next came after the
    # closing handshake and a backoff pause.
    for before, after in zip(hellos, hellos[1:], strict=False):
        assert 5.0 <= after - before <= 5.0 + 2.0 + 1.0, hellos
    lines = reconnect_lines(caplog)
    assert len(lines) >= 2
    assert all("no welcome from the node within 5 s of the hello" in line for line in lines), lines
    assert worker.connections == 0


async def test_a_node_that_is_not_there_is_named_in_the_reconnect_line(autojump_clock, caplog):
    """Nothing listens on the port (it is bound, so nobody else takes it meanwhile): each
    retry's log line says the connection was refused, and where."""
    caplog.set_level(logging.WARNING, logger="orbit.sdk.worker")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        worker = worker_for(f"http://127.0.0.1:{port}")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            with trio.fail_after(60):  # of the mock clock
                while len(reconnect_lines(caplog)) < 2:
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
    for line in reconnect_lines(caplog):
        assert line.startswith(f"worker could not connect (connection refused to 127.0.0.1:{port}); reconnecting in ")
