"""``GET /metrics``: the HTTP side of the node's metrics, and request instrumentation.

Exposure (``NodeConfig.metrics``): ``off`` (404 everywhere), ``open`` (no credential, on a
separate address served by its own small hypercorn server in the node's nursery, meant
for a private network), ``credential`` (``GET /metrics`` on the node's HTTP address with a
bearer credential holding the node-wide scope ``metrics:read``).

Every request also gets its log context, an HTTP metric and an access-log line here
(``begin_request`` and ``observe_response``, called by the app's request hooks).
"""

from __future__ import annotations

import logging

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from hypercorn.typing import ASGIFramework, ASGIReceiveCallable, ASGISendCallable, Scope
from quart import Blueprint, Response, g, request

from orbit_protocol import logs

from ..domain.errors import NotFound
from ..metrics import NodeMetrics
from .auth import bearer_token, node_state
from .envelope import current_request_id

access_log = logging.getLogger("orbit.access")

# Routes probed so often that their access-log lines are kept at debug level.
QUIET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
# The node-wide scope a credential needs to read GET /metrics in "credential" mode.
METRICS_SCOPE = "metrics:read"
# Label of requests that matched no route (the path itself would be unbounded).
UNMATCHED_ROUTE = "unmatched"


blueprint = Blueprint("metrics", __name__)


@blueprint.get("/metrics")
async def metrics_endpoint():
    state = node_state()
    if state.config.metrics != "credential":
        # Exactly what an unknown path answers: the endpoint is not there.
        raise NotFound(f"path: no route {request.path}", field="path")
    # A credential verified before keeps working while the database is unreachable:
    # metrics matter most then.
    who = await state.credentials.authenticate(bearer_token(), stale_if_unavailable=True)
    who.require(METRICS_SCOPE)
    body, content_type = state.metrics.exposition(request.headers.get("Accept", ""))
    return Response(body, status=200, content_type=content_type)


def begin_request() -> None:
    """A request's start: its clock and its log context (request id, the ids in its path)."""
    g.orbit_started = trio.current_time()
    view_args = request.view_args
    ids = {k: v for k, v in view_args.items() if k in logs.CONTEXT_FIELDS} if view_args else {}
    logs.new_context(request_id=current_request_id(), **ids)


def observe_response(metrics: NodeMetrics, response: Response, mode: str = "all", slow_s: float = 1.0) -> None:
    """A request's end: its HTTP metric and its access-log line (``mode``: ORBIT_ACCESS_LOG;
    with ``errors``, a request answered 4xx/5xx or slower than ``slow_s`` at info, the
    others at debug). The time a request waited for its task to finish (``wait_s``) is
    not the node's: both count the request without it, and the line says it apart."""
    req = request._get_current_object()  # type: ignore[attr-defined]
    rule = req.url_rule
    route = rule.rule if rule is not None else UNMATCHED_ROUTE
    started = g.get("orbit_started")
    waited = g.get("orbit_waited", 0.0)
    seconds = trio.current_time() - started - waited if started is not None else 0.0
    status = response.status_code
    metrics.observe_http(req.method, route, status, seconds)
    if mode == "off":
        return
    if mode == "errors":
        level = logging.INFO if status >= 400 or seconds >= slow_s else logging.DEBUG
    else:
        level = logging.DEBUG if route in QUIET_ROUTES else logging.INFO
    if not access_log.isEnabledFor(level):
        return
    access_log.log(
        level,
        "%s %s %d",
        req.method,
        route,
        status,
        extra={
            "request_id": g.get("request_id"),
            "method": req.method,
            "route": route,
            # The path only: a query string could carry something secret.
            "path": req.path,
            "status": status,
            "duration_ms": round(seconds * 1000, 3),
            **({"waited_ms": round(waited * 1000, 3)} if waited else {}),
        },
    )


def asgi_app(metrics: NodeMetrics) -> ASGIFramework:
    """The open metrics server: GET /metrics, nothing else."""

    async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        headers: list[tuple[bytes, bytes]] = []
        if scope["path"] != "/metrics":
            status, body, content_type = 404, b"not found: only /metrics is served here\n", "text/plain; charset=utf-8"
        elif scope["method"] not in ("GET", "HEAD"):
            status, body, content_type = 405, b"method not allowed\n", "text/plain; charset=utf-8"
            headers.append((b"allow", b"GET, HEAD"))
        else:
            accept = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"accept"), "")
            body, content_type = metrics.exposition(accept)
            status = 200
        headers += [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body, "more_body": False}
        )

    return app


async def serve_metrics(metrics: NodeMetrics, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the open metrics endpoint until cancelled; reports the bound addresses."""
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("orbit.metrics.server")
    config.include_server_header = False
    config.graceful_timeout = 0
    await serve(asgi_app(metrics), config, shutdown_trigger=trio.sleep_forever, task_status=task_status, mode="asgi")
