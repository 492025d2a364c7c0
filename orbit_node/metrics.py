"""Prometheus metrics of a node, the ``/metrics`` endpoint, and the claim-turn recorder.

Every node has its own ``CollectorRegistry`` (never the library's global one), so several
nodes in one process (tests, benchmarks) keep separate counts. Two kinds of metrics:

* instruments updated as things happen, through small hooks: claim latency
  (``ClaimPool.observe``), dispatch -> Start latency (the Worker hub), HTTP requests (the
  app), database replays (``Database.on_replay``);
* values the node already keeps, read when scraped (``NodeCollector``): connections,
  claim requests pending / in flight, SQL slots, claims by outcome, claim turns per
  application, tasks dispatched and finished, leases recovered, the database pool.

Exposure (``NodeConfig.metrics``): ``off`` (404 everywhere), ``open`` (no credential, on a
separate address served by its own small hypercorn server in the node's nursery, meant
for a private network), ``credential`` (``GET /metrics`` on the node's HTTP address with a
bearer credential holding the node-wide scope ``metrics:read``).

Claim turns are also written to the database (``TurnRecorder``, table ``claim_turns``),
because each node rotates on its own and an operator wants one view of all of them
(``orbit-admin top``) without knowing or reaching every node's metrics address.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from quart import Blueprint, Response, current_app, g, request

from . import __version__, logs
from .api.auth import bearer_token
from .api.envelope import current_request_id
from .errors import NotFound, OrbitError, PermissionDenied, Unauthenticated, Unavailable
from .store.operations import OperationsStore

log = logging.getLogger("orbit.metrics")
access_log = logging.getLogger("orbit.access")

# The node-wide scope a credential needs to read GET /metrics in "credential" mode.
METRICS_SCOPE = "metrics:read"
# A verified metrics credential is trusted this long before the database is asked again
# (a scrape every 15 s costs one credential lookup a minute). When the database cannot be
# reached, a credential verified before keeps working: metrics matter most then.
AUTH_CACHE_S = 60.0
# Verified metrics credentials remembered per node (a handful of scrapers in practice).
AUTH_CACHE_ENTRIES = 64
# How often a node writes its claim-turn counters to the database (only changed ones).
TURNS_FLUSH_S = 1.0
# How often a node deletes the counters of nodes that stopped or died long ago.
TURNS_PRUNE_S = 600.0
# Claim SQL takes milliseconds; a slow one is a lock wait or a sick database.
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# From the dispatch frame leaving the node to the Worker's Start arriving: network round
# trip plus the Worker's own queueing.
START_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Routes probed so often that their access-log lines are kept at debug level.
QUIET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
# RecoveryStats fields, one label value each.
RECOVERY_OUTCOMES = ("requeued", "retried", "failed", "cancelled", "expired")
# Label of requests that matched no route (the path itself would be unbounded).
UNMATCHED_ROUTE = "unmatched"
# Methods counted under their own name; any other (a client may send anything) is "other".
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@attrs.define(eq=False)
class NodeMetrics:
    """One node's registry and the hooks that feed it."""

    # The node's shared state (``api.app.NodeState``): config, db, node_id, tenancy, services.
    state: Any
    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry, init=False)
    # Application id -> name, learnt from the credentials of connections (turn labels).
    application_names: dict[str, str] = attrs.field(factory=dict, init=False)
    # sha256(token) -> trio time it was last verified with scope metrics:read.
    _verified: dict[str, float] = attrs.field(factory=dict, init=False)
    claim_seconds: Histogram = attrs.field(init=False)
    dispatch_to_start_seconds: Histogram = attrs.field(init=False)
    http_requests: Counter = attrs.field(init=False)
    http_seconds: Histogram = attrs.field(init=False)
    db_replays: Counter = attrs.field(init=False)

    def __attrs_post_init__(self):
        r = self.registry
        self.claim_seconds = Histogram(
            "orbit_claim_duration_seconds", "Claim transactions by outcome (tasks, empty, error), seconds.",
            ["outcome"], buckets=CLAIM_BUCKETS, registry=r,
        )
        self.dispatch_to_start_seconds = Histogram(
            "orbit_dispatch_to_start_seconds", "From sending a dispatch to the Worker's accepted Start, seconds.",
            buckets=START_BUCKETS, registry=r,
        )
        self.http_requests = Counter(
            "orbit_http_requests", "HTTP requests by method, route template and status.",
            ["method", "route", "status"], registry=r,
        )
        self.http_seconds = Histogram(
            "orbit_http_request_duration_seconds", "HTTP request handling time by method and route template, seconds.",
            ["method", "route"], registry=r,
        )
        self.db_replays = Counter(
            "orbit_db_replays", "Transactions replayed after a deadlock or lock-wait error, by MySQL errno.",
            ["errno"], registry=r,
        )
        for outcome in ("tasks", "empty", "error"):
            self.claim_seconds.labels(outcome)
        r.register(NodeCollector(self))
        ProcessCollector(registry=r)

    # -- hooks ---------------------------------------------------------------------------

    def observe_claim(self, grant: Any, outcome: str, seconds: float) -> None:
        self.claim_seconds.labels(outcome).observe(seconds)

    def observe_start(self, seconds: float) -> None:
        self.dispatch_to_start_seconds.observe(max(seconds, 0.0))

    def observe_replay(self, errno: int) -> None:
        self.db_replays.labels(str(errno)).inc()

    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in HTTP_METHODS else "other"
        self.http_requests.labels(method, route, str(status)).inc()
        self.http_seconds.labels(method, route).observe(max(seconds, 0.0))

    def note_application(self, application_id: str, name: str) -> None:
        self.application_names[application_id] = name

    # -- exposure ------------------------------------------------------------------------

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The registry in the format the scraper asked for (Prometheus text by default)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    async def authorize(self, token: str) -> None:
        """Accept a bearer credential holding ``metrics:read``; raise the API error otherwise."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = trio.current_time()
        seen = self._verified.get(key)
        if seen is not None and now - seen < AUTH_CACHE_S:
            return
        try:
            principal = await self.state.tenancy.authenticate(token)
        except Unavailable:
            if seen is not None:
                return
            raise
        except Unauthenticated:
            self._verified.pop(key, None)
            raise
        if not principal.allows(METRICS_SCOPE):
            self._verified.pop(key, None)
            raise PermissionDenied(f"authorization: credential lacks scope {METRICS_SCOPE}", field="authorization")
        self._verified[key] = now
        while len(self._verified) > AUTH_CACHE_ENTRIES:
            self._verified.pop(min(self._verified, key=self._verified.__getitem__))


class NodeCollector:
    """Values the node keeps anyway, read at scrape time (nothing is copied in between)."""

    def __init__(self, metrics: NodeMetrics):
        self.metrics = metrics

    def collect(self):
        state = self.metrics.state
        info = GaugeMetricFamily("orbit_node_info", "This node: id and version (always 1).", labels=["node_id", "version"])
        info.add_metric([state.node_id, __version__], 1)
        yield info

        hub = state.services.get("workers")
        if hub is not None:
            yield GaugeMetricFamily("orbit_worker_connections", "Worker connections served now.", value=hub.admitted)
            yield GaugeMetricFamily(
                "orbit_worker_connections_limit", "Worker connections this node accepts at most.",
                value=hub.config.max_connections,
            )
            yield CounterMetricFamily(
                "orbit_worker_connections_refused", "Worker connections refused because the node was full.",
                value=hub.refused,
            )
            yield CounterMetricFamily("orbit_tasks_dispatched", "Reserved tasks sent to Workers.", value=hub.dispatched)
            finished = CounterMetricFamily(
                "orbit_tasks_finished", "Finish reports applied, by outcome (succeeded, retry, failed, cancelled, "
                "expired, ownership_lost).", labels=["outcome"],
            )
            for outcome in ("succeeded", "retry", "failed", "cancelled", "expired", "ownership_lost"):
                finished.add_metric([outcome], hub.finished.get(outcome, 0))
            yield finished

        pool = state.services.get("claims")
        if pool is not None:
            stats = pool.statistics()
            scheduler = pool.scheduler.statistics()
            limits = pool.scheduler.limits
            yield GaugeMetricFamily("orbit_claim_requests_pending", "Claim requests waiting for a turn.", value=stats.pending)
            yield GaugeMetricFamily(
                "orbit_claim_requests_in_flight", "Claim requests whose SQL runs now.", value=stats.in_flight
            )
            yield GaugeMetricFamily(
                "orbit_claim_requests_limit", "Pending + in-flight claim requests a node holds at most.",
                value=limits.max_requests,
            )
            yield CounterMetricFamily(
                "orbit_claim_requests_refused", "Claim requests refused (node full, or one already outstanding).",
                value=scheduler.refused,
            )
            yield GaugeMetricFamily(
                "orbit_claim_sql_slots_in_use", "Claim SQL slots occupied now.", value=stats.in_flight
            )
            yield GaugeMetricFamily("orbit_claim_sql_slots", "Claim SQL slots of this node.", value=limits.sql_slots)
            claims = CounterMetricFamily(
                "orbit_claims", "Claims by outcome: tasks (reserved some), empty, error, and cached_empty "
                "(a turn skipped because an empty result for the same key is remembered this scan cycle).",
                labels=["outcome"],
            )
            claims.add_metric(["tasks"], stats.claims_with_tasks)
            claims.add_metric(["empty"], stats.claims_empty)
            claims.add_metric(["error"], stats.claims_failed)
            claims.add_metric(["cached_empty"], stats.cached_empty_skips)
            yield claims
            yield CounterMetricFamily("orbit_tasks_reserved", "Tasks reserved by this node's claims.", value=stats.tasks_reserved)
            turns = CounterMetricFamily(
                "orbit_claim_turns", "Claim turns granted per application by this node's fair pool (the fairness "
                "signal: busy applications should advance at the same pace).",
                labels=["application_id", "application"],
            )
            names = self.metrics.application_names
            for application_id, count in sorted(stats.turns_by_application.items()):
                turns.add_metric([application_id, names.get(application_id, "")], count)
            yield turns

        sweeper = state.services.get("sweeper")
        if sweeper is not None:
            recovered = CounterMetricFamily(
                "orbit_leases_recovered", "Tasks this node's recovery sweeper settled: requeued (reservation lease "
                "expired), retried/failed/cancelled (run lease expired), expired (deadline passed while queued "
                "or reserved).", labels=["outcome"],
            )
            for outcome in RECOVERY_OUTCOMES:
                recovered.add_metric([outcome], getattr(sweeper.totals, outcome))
            yield recovered
            yield CounterMetricFamily("orbit_recovery_passes", "Recovery sweeper passes run.", value=sweeper.passes)

        db = state.db.statistics()
        yield GaugeMetricFamily("orbit_db_pool_size", "Database connections this node may open.", value=db.size)
        yield GaugeMetricFamily("orbit_db_connections_open", "Database connections open now.", value=db.open)
        yield GaugeMetricFamily("orbit_db_connections_in_use", "Database connections borrowed now.", value=db.in_use)


# -- the HTTP side -----------------------------------------------------------------------

blueprint = Blueprint("metrics", __name__)


@blueprint.get("/metrics")
async def metrics_endpoint():
    state = current_app.extensions["orbit"]
    if state.config.metrics != "credential":
        # Exactly what an unknown path answers: the endpoint is not there.
        raise NotFound(f"path: no route {request.path}", field="path")
    await state.metrics.authorize(bearer_token())
    body, content_type = state.metrics.exposition(request.headers.get("Accept", ""))
    return Response(body, status=200, content_type=content_type)


def instrument_app(app, state) -> None:
    """Request context for logs, HTTP metrics, the access log and the /metrics route.

    Call before the app registers its own hooks, so the context is bound first."""

    @app.before_request
    async def _begin():
        g.orbit_started = trio.current_time()
        ids = {k: v for k, v in (request.view_args or {}).items() if k in logs.CONTEXT_FIELDS}
        logs.new_context(request_id=current_request_id(), **ids)

    @app.after_request
    async def _observe(response):
        rule = request.url_rule
        route = rule.rule if rule is not None else UNMATCHED_ROUTE
        started = g.get("orbit_started")
        seconds = trio.current_time() - started if started is not None else 0.0
        state.metrics.observe_http(request.method, route, response.status_code, seconds)
        access_log.log(
            logging.DEBUG if route in QUIET_ROUTES else logging.INFO,
            "%s %s %d", request.method, route, response.status_code,
            extra={
                "request_id": g.get("request_id"),
                "method": request.method,
                "route": route,
                # The path only: a query string could carry something secret.
                "path": request.path,
                "status": response.status_code,
                "duration_ms": round(seconds * 1000, 3),
            },
        )
        return response

    app.register_blueprint(blueprint)


def asgi_app(metrics: NodeMetrics):
    """The open metrics server: GET /metrics, nothing else."""

    async def app(scope, receive, send):
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
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

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


# -- claim turns in the database -----------------------------------------------------------


@attrs.define(eq=False)
class TurnRecorder:
    """Writes a node's cumulative claim turns per application to ``claim_turns``.

    Every ``interval_s`` the applications whose count changed are upserted (absolute
    values, so a lost write is repaired by the next); an idle node writes nothing. On
    stop the node's rows are deleted; rows of nodes that died are pruned by the others.
    """

    store: OperationsStore
    node_id: str
    # The scheduler's cumulative turns per application id.
    turns: Callable[[], Mapping[str, int]]
    interval_s: float = TURNS_FLUSH_S
    prune_interval_s: float = TURNS_PRUNE_S
    flushes: int = 0
    _recorded: dict[str, int] = attrs.field(factory=dict, init=False)
    _next_prune: float | None = attrs.field(default=None, init=False)
    _flushed: trio.Event = attrs.field(factory=trio.Event, init=False)

    async def flush(self) -> int:
        """Write the changed counters now; returns how many applications were written."""
        current = dict(self.turns())
        changed = {app: n for app, n in current.items() if self._recorded.get(app) != n}
        if changed:
            await self.store.record_turns(self.node_id, changed)
            self._recorded.update(changed)
        return len(changed)

    async def wait_for_flush(self) -> None:
        """Wait until the flush that runs next has finished."""
        await self._flushed.wait()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self)
        try:
            while True:
                try:
                    await self.flush()
                    now = trio.current_time()
                    if self._next_prune is None or now >= self._next_prune:
                        self._next_prune = now + self.prune_interval_s
                        await self.store.prune_turns()
                except OrbitError as exc:
                    # The database may be unreachable; the counters are written next time.
                    log.warning("could not record claim turns: %s", exc.message)
                self.flushes += 1
                done, self._flushed = self._flushed, trio.Event()
                done.set()
                await trio.sleep(self.interval_s)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                try:
                    await self.store.forget_turns(self.node_id)
                except Exception as exc:
                    log.warning("could not delete this node's claim turns (another node prunes them): %s", exc)
