"""What request handlers share: one frozen ``NodeState`` per node, and the metrics credential cache."""

from __future__ import annotations

import hashlib

import attrs
import trio

from ..config import NodeConfig
from ..db import Database
from ..errors import PermissionDenied, Unauthenticated, Unavailable
from ..metrics import NodeMetrics
from ..services import DispatchServices, ServiceSet
from ..store.tasks import TaskStore
from ..store.tenancy import TenancyStore

# The node-wide scope a credential needs to read GET /metrics in "credential" mode.
METRICS_SCOPE = "metrics:read"
# A verified metrics credential is trusted this long before the database is asked again
# (a scrape every 15 s costs one credential lookup a minute). When the database cannot be
# reached, a credential verified before keeps working: metrics matter most then.
AUTH_CACHE_S = 60.0
# Verified metrics credentials remembered per node (a handful of scrapers in practice).
AUTH_CACHE_ENTRIES = 64


@attrs.define(eq=False)
class MetricsAuth:
    """Verifies ``metrics:read`` credentials, remembering the verified ones for a while."""

    tenancy: TenancyStore
    # sha256(token) -> trio time it was last verified with scope metrics:read.
    _verified: dict[str, float] = attrs.field(factory=dict, init=False)

    async def authorize(self, token: str) -> None:
        """Accept a bearer credential holding ``metrics:read``; raise the API error otherwise."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = trio.current_time()
        seen = self._verified.get(key)
        if seen is not None and now - seen < AUTH_CACHE_S:
            return
        try:
            principal = await self.tenancy.authenticate(token)
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


@attrs.frozen
class NodeState:
    """What request handlers share: configuration, the database, repositories and services.

    Built once per node (``NodeState.build``); handlers read it and never write into it."""

    config: NodeConfig
    db: Database
    node_id: str
    tenancy: TenancyStore
    tasks: TaskStore
    # This node's Prometheus registry and the hooks that feed it.
    metrics: NodeMetrics
    metrics_auth: MetricsAuth
    services: DispatchServices

    @classmethod
    def build(
        cls,
        *,
        config: NodeConfig,
        db: Database,
        node_id: str,
        run: ServiceSet = ServiceSet(),
        shutdown_requested: trio.Event | None = None,
    ) -> NodeState:
        """The node's state with the services of ``run`` (none: an HTTP-only node)."""
        tenancy = TenancyStore(db)
        metrics = NodeMetrics(node_id, db)
        services = DispatchServices.build(
            config=config,
            db=db,
            node_id=node_id,
            tenancy=tenancy,
            metrics=metrics,
            shutdown_requested=shutdown_requested if shutdown_requested is not None else trio.Event(),
            run=run,
        )
        return cls(
            config=config,
            db=db,
            node_id=node_id,
            tenancy=tenancy,
            tasks=TaskStore(db),
            metrics=metrics,
            metrics_auth=MetricsAuth(tenancy),
            services=services,
        )
