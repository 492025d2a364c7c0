"""What request handlers share: one frozen ``NodeState`` per node."""

from __future__ import annotations

import secrets

import attrs
import trio

from ..config import NodeConfig
from ..db import Database
from ..metrics import NodeMetrics
from ..services import DispatchServices, ServiceSet
from ..store.tasks import TaskStore
from ..store.tenancy import TenancyStore
from .credentials import CredentialCache


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
    # Verified bearer credentials (/v1 and /metrics), trusted for config.credential_cache_s.
    credentials: CredentialCache
    services: DispatchServices
    # Signs console session cookies: ORBIT_CONSOLE_SECRET, or random for this process.
    console_key: bytes = attrs.field(repr=False)

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
            credentials=CredentialCache(tenancy, ttl_s=config.credential_cache_s),
            services=services,
            console_key=(config.console_secret or "").encode() or secrets.token_bytes(32),
        )
