"""``GET /v1/workers/connect``: the WebSocket endpoint on the node's HTTP address.

The handshake is refused with an HTTP status and the usual error envelope when:
the credential is sent in the query string (400), is missing/unknown/revoked (401),
lacks ``workers:connect`` (403), the node already serves ``max_connections`` Worker
connections and the application is not a whole slot under its fair share of them (503
RESOURCE_EXHAUSTED, field ``connections``), the application already holds its own
``max_worker_connections`` here (503 RESOURCE_EXHAUSTED, field
``max_worker_connections``), or the node is shutting down (503 UNAVAILABLE). A refusal
happens before the upgrade and costs the existing connections nothing. On a full node, a
connection of an application under its share is admitted and one of the application most
over its share is moved away (``workers/slots.py``).
"""

from __future__ import annotations

import trio
from quart import Blueprint, websocket

from ..domain.errors import InvalidArgument, OrbitError, ResourceExhausted, Unavailable
from ..workers.connection import WorkerConnectionClosed
from ..workers.slots import Refused
from . import envelope
from .auth import bearer_token, node_state

blueprint = Blueprint("worker_socket", __name__)


class ConnectionLimitReached(ResourceExhausted):
    """The node serves its maximum of Worker connections: 503, another node may have room."""

    http_status = 503


# Query parameters that would carry a credential; the handshake refuses them outright.
CREDENTIAL_PARAMS = ("token", "access_token", "auth", "authorization", "key", "api_key", "credential")


class QuartTransport:
    """The connection's view of a Quart WebSocket. A peer disconnect cancels the handler."""

    async def receive(self) -> str | bytes:
        return await websocket.receive()

    async def send(self, text: str) -> None:
        try:
            await websocket.send(text)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise WorkerConnectionClosed("peer gone") from None

    async def close(self, code: int, reason: str) -> None:
        try:
            await websocket.close(code, reason)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            # The TCP connection is closing under the close frame: the peer went first.
            # BusyResourceError is hypercorn's (0.18) EOF, sent without its send lock,
            # meeting this frame on the socket.
            raise WorkerConnectionClosed("peer gone") from None


@blueprint.websocket("/v1/workers/connect")
async def connect():
    state = node_state()
    hub = state.services.hub
    try:
        if any(name.lower() in CREDENTIAL_PARAMS for name in websocket.args) or "orb_" in websocket.query_string.decode(
            "latin1"
        ):
            raise InvalidArgument(
                "credentials must be sent in the Authorization header, never in the query string", field="query"
            )
        principal = await state.shards.authenticate(bearer_token(websocket.headers))
        principal.require("workers:connect")
        if hub is None or hub.shutdown_requested.is_set():
            raise Unavailable("this node is not accepting Worker connections", field="node")
        slot = hub.admit(principal)
        if isinstance(slot, Refused):
            raise refusal(slot, hub.config.max_connections)
    except OrbitError as exc:
        return envelope.failure(exc)
    try:
        await websocket.accept()
        await hub.connection(principal, QuartTransport(), slot).serve()
    finally:
        hub.release(slot)


def refusal(refused: Refused, max_connections: int) -> ConnectionLimitReached:
    """The handshake's answer to a refused slot, naming what is exhausted."""
    if refused.reason == "application_limit":
        return ConnectionLimitReached(
            f"the application already holds its maximum of {refused.bound:g} Worker connections on this node "
            "(orbit-admin application connections); connect to another node",
            field="max_worker_connections",
        )
    return ConnectionLimitReached(
        f"this node already serves {max_connections} Worker connections and the application holds "
        f"{refused.held} of them, its fair share being {refused.bound:.3g}; connect to another node",
        field="connections",
    )
