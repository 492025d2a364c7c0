"""Bearer authentication of /v1 requests, and the request's Principal.

The application and namespace of a request come from the credential, resolved on
the server; nothing in the request body or query can change them.
"""

from __future__ import annotations

from quart import current_app, g, request
from werkzeug.datastructures import Headers

from orbit_protocol import logs

from ..domain.errors import PermissionDenied, Unauthenticated
from ..services import Shard
from ..store.tenancy import ALL_QUEUES, Principal
from .state import NodeState

# Either scope lets a credential read a queue's settings.
QUEUE_READ_SCOPES = ("queues:manage", "tasks:read")


def node_state() -> NodeState:
    return current_app.extensions["orbit"]


def bearer_token(headers: Headers | None = None) -> str:
    """The credential of ``Authorization: Bearer <token>`` (of the current request by default)."""
    values = (request.headers if headers is None else headers).getlist("Authorization")
    if not values:
        raise Unauthenticated("authorization: the Authorization: Bearer header is required", field="authorization")
    if len(values) > 1:
        raise Unauthenticated("authorization: Authorization header given more than once", field="authorization")
    scheme, _, token = values[0].strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("authorization: expected the Bearer scheme", field="authorization")
    return token.strip()


async def authenticate() -> None:
    """``before_request`` of the /v1 blueprint."""
    g.principal = who = await node_state().credentials.authenticate(bearer_token())
    logs.bind(application=who.application, namespace_id=who.namespace_id)


def principal() -> Principal:
    return g.principal


def shard() -> Shard:
    """The repositories and services of the shard of the request's application."""
    return node_state().shard(g.principal)


def require_any(scope: str) -> Principal:
    """The credential holds ``scope`` for at least one queue (or all queues)."""
    who = principal()
    if not who.scopes.get(scope):
        raise PermissionDenied(f"authorization: credential lacks scope {scope}", field="authorization")
    return who


def require_all_queues(scope: str) -> Principal:
    who = principal()
    if who.scopes.get(scope) != ALL_QUEUES:
        raise PermissionDenied(f"authorization: credential lacks scope {scope} for all queues", field="authorization")
    return who


def require_queue_read(queue_id: str) -> Principal:
    who = principal()
    if not any(who.allows(scope, queue_id) for scope in QUEUE_READ_SCOPES):
        raise PermissionDenied(
            f"authorization: credential lacks scope queues:manage or tasks:read for queue {queue_id}",
            field="authorization",
        )
    return who


def readable_queues() -> list[str] | None:
    """Queue ids whose settings the credential may read; None = every queue of the namespace."""
    who = principal()
    grants = [who.queue_filter(scope) for scope in QUEUE_READ_SCOPES if who.scopes.get(scope)]
    if not grants:
        raise PermissionDenied(
            "authorization: credential lacks scope queues:manage or tasks:read", field="authorization"
        )
    queue_ids: set[str] = set()
    for grant in grants:
        if grant is None:
            return None
        queue_ids.update(grant)
    return sorted(queue_ids)
