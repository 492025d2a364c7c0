"""A WebSocket upgrade sent to a route that is not a WebSocket one is answered as a
request to that route would be (404 or 405 with the API's envelope), never 500, and
logs no traceback."""

from __future__ import annotations

import logging

import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from orbit_node.api import worker_socket
from orbit_node.workers.connection import WorkerConnectionClosed


@pytest.mark.parametrize(
    ("path", "status", "code"), [("/v1/tasks", 405, "METHOD_NOT_ALLOWED"), ("/v1/nowhere", 404, "NOT_FOUND")]
)
async def test_an_upgrade_to_a_route_that_is_not_a_websocket_is_refused_plainly(
    running_node, caplog, path, status, code
):
    url = running_node.base_url.replace("http://", "ws://") + path
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        with pytest.raises(ConnectionRejected) as refused:
            async with open_websocket_url(url):
                pass
        assert refused.value.status_code == status
        assert f'"code":"{code}"'.encode() in (refused.value.body or b"")
    assert not [r for r in caplog.records if r.exc_info], "no traceback is logged"


@pytest.mark.parametrize("error", [trio.BusyResourceError, trio.BrokenResourceError, trio.ClosedResourceError])
async def test_a_close_frame_that_meets_the_peers_tcp_close_ends_the_connection_quietly(monkeypatch, error):
    """Hypercorn 0.18 sends a connection's EOF without its send lock: a close frame sent
    at that moment raises BusyResourceError on the socket. The peer is gone either way, so
    the transport says so in the connection's own terms instead of failing the handler."""

    class ClosingSocket:
        async def send(self, text):
            raise error("socket closing")

        async def close(self, code, reason):
            raise error("socket closing")

    monkeypatch.setattr(worker_socket, "websocket", ClosingSocket())
    with pytest.raises(WorkerConnectionClosed):
        await worker_socket.QuartTransport().close(1001, "node shutting down")
    if error is not trio.BusyResourceError:
        with pytest.raises(WorkerConnectionClosed):
            await worker_socket.QuartTransport().send("{}")
