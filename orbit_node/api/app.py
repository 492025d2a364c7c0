"""Application factory: routes, error mapping and the shared state they use."""

from __future__ import annotations

import logging

import attrs
import trio
from quart import request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..config import NodeConfig
from ..db import Database
from ..db import migrate
from ..errors import NotFound, OrbitError, PayloadTooLarge, InvalidArgument, Unavailable
from ..store.tenancy import TenancyStore
from . import envelope

log = logging.getLogger("orbit.http")

# /readyz gives the database this long to answer before reporting not ready.
READY_TIMEOUT_S = 2.0


@attrs.define(eq=False)
class NodeState:
    """What request handlers share: configuration, the pool and the repositories."""

    config: NodeConfig
    db: Database
    node_id: str
    tenancy: TenancyStore = attrs.field(init=False)
    # Extra services (dispatch, workers, plans) attach themselves here.
    services: dict = attrs.field(factory=dict)

    def __attrs_post_init__(self):
        self.tenancy = TenancyStore(self.db)


def create_app(state: NodeState) -> QuartTrio:
    app = QuartTrio("orbit_node")
    app.config["MAX_CONTENT_LENGTH"] = state.config.max_body_bytes
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.extensions["orbit"] = state

    @app.before_request
    async def _request_id():
        envelope.current_request_id()

    @app.errorhandler(OrbitError)
    async def _orbit_error(exc: OrbitError):
        if exc.http_status >= 500:
            log.error("request failed: %s", exc.message)
        return envelope.error(exc)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException):
        status = exc.code or 500
        if status == 413:
            mapped: OrbitError = PayloadTooLarge(
                f"request body exceeds {state.config.max_body_bytes} bytes", field="body"
            )
        elif status == 404:
            mapped = NotFound(f"no route {request.path}", field="path")
        elif status == 405:
            mapped = InvalidArgument(f"method {request.method} not allowed on {request.path}", field="method")
            mapped.http_status = 405
            mapped.code = "METHOD_NOT_ALLOWED"
        else:
            mapped = InvalidArgument(exc.description or "bad request", field=None)
            mapped.http_status = status
        return envelope.error(mapped)

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        error = OrbitError("internal error")
        return envelope.error(error)

    @app.get("/healthz")
    async def healthz():
        return envelope.ok({"status": "ok", "node_id": state.node_id})

    @app.get("/readyz")
    async def readyz():
        version = None
        with trio.move_on_after(READY_TIMEOUT_S):
            try:
                version = await migrate.current_version(state.db)
            except OrbitError:
                version = None
        if version is None:
            raise Unavailable("database unreachable", field="database")
        if version != migrate.HEAD:
            raise Unavailable(
                f"database schema is at {version:06d}, this node needs {migrate.HEAD:06d}", field="schema"
            )
        return envelope.ok({"status": "ready", "schema_version": version})

    return app
