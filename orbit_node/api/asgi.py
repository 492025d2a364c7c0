"""The HTTP connection adapter between hypercorn and the app (quart-trio's, with one fix).

When the app answers before it has read a request body (413, 401, 408, ...), hypercorn
closes the connection from inside the send of that answer, and in the same step
delivers "disconnect" to the app; quart-trio then cancels the request's nursery, and
with it the close: the socket stays open for as long as the client cares to keep it
(a slowloris that sends half a body holds a connection forever). Sending the response
shielded, and bounded, lets the close complete.
"""

from __future__ import annotations

import trio
from quart_trio.asgi import TrioASGIHTTPConnection

# Bound on sending one response when the app sets no RESPONSE_TIMEOUT: every answer of
# this API is small JSON.
RESPONSE_SEND_TIMEOUT_S = 10.0


class ClosingHTTPConnection(TrioASGIHTTPConnection):
    async def handle_request(self, nursery: trio.Nursery, request, send) -> None:  # type: ignore[override]
        response = await self.app.handle_request(request)
        timeout = self.app.config["RESPONSE_TIMEOUT"] or RESPONSE_SEND_TIMEOUT_S
        with trio.CancelScope(shield=True), trio.move_on_after(timeout):
            await self._send_response(send, response)
        nursery.cancel_scope.cancel()
