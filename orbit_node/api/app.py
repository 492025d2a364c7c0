"""Application factory: routes, error mapping and the shared state they use."""

from __future__ import annotations

import logging

from quart import Blueprint, g, has_request_context, request, websocket
from quart_trio import QuartTrio
from werkzeug import exceptions as http_exceptions
from werkzeug.exceptions import HTTPException

from ..domain.errors import InvalidArgument, NotFound, OrbitError, PayloadTooLarge
from . import auth, envelope, explain, plans, queues, task_actions, tasks, validation
from .asgi import ClosingHTTPConnection
from .console.views import blueprint as console_blueprint
from .metrics import begin_request, observe_response
from .metrics import blueprint as metrics_blueprint
from .readiness import Readiness
from .state import NodeState
from .worker_socket import blueprint as worker_socket_blueprint

log = logging.getLogger("orbit.http")


class MethodNotAllowed(OrbitError):
    code = "METHOD_NOT_ALLOWED"
    http_status = 405


class OrbitApp(QuartTrio):
    async def dispatch_request(self, request_context=None):
        """The route handler, in its application's turn of the node's fair admission
        (``orbit_node/admission/fair.py``): /v1 requests (their credential's application) and
        signed-in console pages. What has no application (/healthz, /readyz, /metrics, the
        console's sign-in) is not queued; the Worker WebSocket is a websocket, not
        dispatched here (its connections have fair slots of their own)."""
        context = g._get_current_object()
        who = getattr(context, "principal", None) or getattr(context, "console_principal", None)
        if who is None:
            return await super().dispatch_request(request_context)
        # The body arrives first, outside the turn: a client that sends it slowly (or never:
        # a slowloris with a valid credential) must not hold one of its application's turns
        # while the node waits for it. A body that fails (too large, too slow) is refused by
        # the handler, which meets the same error, without taking a turn.
        try:
            await request.get_data(cache=True, as_text=False, parse_form_data=False)
        except Exception:
            return await super().dispatch_request(request_context)
        state: NodeState = self.extensions["orbit"]
        async with state.services.admission.turn(who.application_id, who.application) as turn:
            # A route that waits for something other than the node's work (a task to
            # finish) gives the turn back meanwhile (api/tasks.py, ``away_from_turn``).
            context.orbit_turn = turn
            return await super().dispatch_request(request_context)


def v1_blueprint() -> Blueprint:
    """The authenticated task interface: every route under it needs a bearer credential."""
    v1 = Blueprint("v1", __name__, url_prefix="/v1")
    v1.before_request(auth.authenticate)
    v1.register_blueprint(tasks.bp)
    v1.register_blueprint(task_actions.bp)
    v1.register_blueprint(queues.bp)
    v1.register_blueprint(explain.blueprint)
    v1.register_blueprint(plans.bp)
    return v1


def create_app(state: NodeState) -> QuartTrio:
    app = OrbitApp("orbit_node", static_folder=None)
    app.asgi_http_class = ClosingHTTPConnection
    app.config["MAX_CONTENT_LENGTH"] = state.config.max_body_bytes
    app.config["BODY_TIMEOUT"] = state.config.body_timeout_s
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.extensions["orbit"] = state
    app.register_blueprint(metrics_blueprint)
    # One per database: ORBIT_MYSQL_DSN's, then each other shard's (named when there are several).
    shards = state.shards.all
    readiness = [Readiness(shard.db, label=shard.label if len(shards) > 1 else None) for shard in shards]

    async def probe():
        """The first database that is not ready, or the main one's ready answer."""
        verdicts = [await each.probe() for each in readiness]
        return next((v for v in verdicts if not v.ready), verdicts[0])

    @app.before_serving
    async def _check_database():
        # Once at start-up: an operator learns at once (a warning saying what to run)
        # that the node cannot serve yet; /readyz logs only changes after this.
        await probe()

    access_mode, access_slow_s = state.config.access_log, state.config.access_log_slow_ms / 1000

    # One hook before and one after every request (each hook is a call per request).
    @app.before_request
    async def _begin():
        # First, so every later hook and handler logs with the request's context.
        begin_request()
        # A declared body over the limit is refused before authentication or reading.
        validation.check_declared_length()

    @app.after_request
    async def _end(response):
        # A response given before the body was read (413, 401, 415, ...) leaves unread
        # bytes on the connection, and hypercorn stops reading once the app is done:
        # close it, so the client neither hangs on it nor reuses it.
        if validation.has_body() and not validation.body_was_read():
            response.headers["Connection"] = "close"
        observe_response(state.metrics, response, access_mode, access_slow_s)
        return response

    @app.errorhandler(OrbitError)
    async def _orbit_error(exc: OrbitError):
        # The statement and the server's words stay in the log, not in the response.
        return envelope.failure(exc)

    def target() -> tuple[str, str]:
        """The method and path of what failed: a request, or a WebSocket upgrade sent to a
        route that is not one (answered as any request to it, before the upgrade)."""
        if has_request_context():
            return request.method, request.path
        return "GET", websocket.path

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException):
        method, path = target()
        status = exc.code or 500
        if status == 413:
            mapped: OrbitError = PayloadTooLarge(
                f"body: request body exceeds {state.config.max_body_bytes} bytes", field="body"
            )
        elif status == 404:
            mapped = NotFound(f"path: no route {path}", field="path")
        elif status == 405:
            mapped = MethodNotAllowed(f"method: {method} is not allowed on {path}", field="method")
        elif status == 408:
            mapped = InvalidArgument("body: the request body did not arrive in time", field="body")
            mapped.http_status = 408
        else:
            mapped = InvalidArgument(f"request: {exc.description or 'bad request'}", field="request")
            mapped.http_status = status
        response = envelope.error(mapped)
        if isinstance(exc, http_exceptions.MethodNotAllowed) and exc.valid_methods:
            response.headers["Allow"] = ", ".join(sorted(exc.valid_methods))
        return response

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception):
        log.exception("unhandled error on %s %s", *target())
        error = OrbitError("internal error")
        return envelope.error(error)

    @app.get("/healthz")
    async def healthz():
        return envelope.ok({"status": "ok", "node_id": state.node_id})

    @app.get("/readyz")
    async def readyz():
        verdict = await probe()
        if verdict.ready:
            return envelope.ok({"status": "ready", "schema_version": verdict.schema_version})
        # Answered here, not raised: the error handler would log every probe.
        return envelope.error(verdict.error(), cause=verdict.cause)

    app.register_blueprint(v1_blueprint())
    # The Worker endpoint authenticates at the handshake itself (HTTP refusals, no upgrade).
    app.register_blueprint(worker_socket_blueprint)
    if state.config.console:
        # The read-only console: HTML pages with a session cookie of their own (api/console/).
        app.register_blueprint(console_blueprint)
    return app
