"""What request handlers share: one frozen ``NodeState`` per node."""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import attrs
import trio

from ..config import NodeConfig
from ..db import Database
from ..metrics import NodeMetrics
from ..services import NodeServices, ServiceSet, Shard, Shards
from ..store.tenancy import Principal
from .credentials import CredentialCache


@attrs.frozen
class NodeState:
    """What request handlers share: configuration, the databases, repositories and services.

    Built once per node (``NodeState.build``); handlers read it and never write into it.
    A handler reaches its tenant's rows through ``shard(principal)``: the repositories of the
    database that holds the principal's application (docs/scaling.md)."""

    config: NodeConfig
    # The node's own database (ORBIT_MYSQL_DSN): the node registry, the schema, readiness.
    db: Database
    node_id: str
    # This node's Prometheus registry and the hooks that feed it.
    metrics: NodeMetrics
    # Verified bearer credentials (/v1 and /metrics), trusted for config.credential_cache_s.
    credentials: CredentialCache
    services: NodeServices
    # Signs console session cookies: ORBIT_CONSOLE_SECRET, or random for this process.
    console_key: bytes = attrs.field(repr=False)

    @property
    def shards(self) -> Shards:
        return self.services.shards

    def shard(self, principal: Principal) -> Shard:
        """The shard (repositories and services) of ``principal``'s application."""
        return self.services.shards.of(principal)

    @classmethod
    def build(
        cls,
        *,
        config: NodeConfig,
        db: Database,
        shard_dbs: Sequence[Database] = (),
        node_id: str,
        run: ServiceSet = ServiceSet(),
        shutdown_requested: trio.Event | None = None,
    ) -> NodeState:
        """The node's state with the services of ``run`` (none: an HTTP-only node).

        ``shard_dbs``: one database per ``config.shard_dsns``, in that order."""
        metrics = NodeMetrics(node_id, db)
        services = NodeServices.build(
            config=config,
            db=db,
            shard_dbs=shard_dbs,
            node_id=node_id,
            metrics=metrics,
            shutdown_requested=shutdown_requested if shutdown_requested is not None else trio.Event(),
            run=run,
        )
        services.report_to(metrics)
        return cls(
            config=config,
            db=db,
            node_id=node_id,
            metrics=metrics,
            credentials=CredentialCache(services.shards, ttl_s=config.credential_cache_s),
            services=services,
            console_key=(config.console_secret or "").encode() or secrets.token_bytes(32),
        )
