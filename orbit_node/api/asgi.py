"""The HTTP connection adapter between hypercorn and the app (quart-trio's, with changes).

When the app answers before it has read a request body (413, 401, 408, ...), hypercorn
closes the connection from inside the send of that answer, and in the same step
delivers "disconnect" to the app; quart-trio then cancels the request's nursery, and
with it the close: the socket stays open for as long as the client cares to keep it
(a slowloris that sends half a body holds a connection forever). Sending the response
shielded, and bounded, lets the close complete.

Every answer of this API is one small in-memory body: it goes out as the headers and
one final body message, not quart's body-then-empty-end sequence (one ASGI send and one
pass through hypercorn's stream fewer per request).
"""

from __future__ import annotations

import trio
from quart.utils import encode_headers
from quart.wrappers.response import DataBody, Response
from quart_trio.asgi import TrioASGIHTTPConnection

# Bound on sending one response when the app sets no RESPONSE_TIMEOUT: every answer of
# this API is small JSON.
RESPONSE_SEND_TIMEOUT_S = 10.0


class ClosingHTTPConnection(TrioASGIHTTPConnection):
    async def __call__(self, receive, send) -> None:
        # quart-trio starts both halves as tasks of the nursery; the request half runs in
        # the nursery's own task here (one task fewer per request, the same cancellation:
        # either half finishing cancels the other).
        request = self._create_request_from_scope(send)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.handle_messages, nursery, request, receive)
            await self.handle_request(nursery, request, send)

    async def handle_request(self, nursery: trio.Nursery, request, send) -> None:  # type: ignore[override]
        response = await self.app.handle_request(request)
        timeout = self.app.config["RESPONSE_TIMEOUT"] or RESPONSE_SEND_TIMEOUT_S
        # Shielded from the nursery's cancellation, bounded by its own deadline.
        with trio.CancelScope(shield=True, deadline=trio.current_time() + timeout):
            await self._send_response(send, response)
        nursery.cancel_scope.cancel()

    async def _send_response(self, send, response) -> None:
        if not isinstance(response, Response) or type(response.response) is not DataBody:
            await super()._send_response(send, response)
            return
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": encode_headers(response.headers)}
        )
        body = response.response
        await send({"type": "http.response.body", "body": body.data[body.begin : body.end], "more_body": False})
