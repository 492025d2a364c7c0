"""A WebSocket upgrade sent to a route that is not a WebSocket one is answered as a
request to that route would be (404 or 405 with the API's envelope), never 500, and
logs no traceback."""

from __future__ import annotations

import logging

import pytest
from trio_websocket import ConnectionRejected, open_websocket_url


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
