"""The node process: HTTP/WebSocket server plus the background services, one nursery.

Shutdown is two-phase (hypercorn's trio runner, River's fetch/work contexts):
``request_shutdown()`` first stops new claims and connections, then running
connections get ``shutdown_grace_s`` to drain; the services stay until the claims
still in flight have finished (within the same grace, counted from the request);
whatever is left then is cancelled and reservations committed but never sent are
recovered by the database lease.
"""

from __future__ import annotations

import logging
import socket

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from . import __version__
from .api.app import create_app
from .api.metrics import serve_metrics
from .api.state import NodeState
from .config import NodeConfig
from .db import Database
from .domain.ids import random_id
from .services import ServiceSet
from .store.nodes import NodeStore

log = logging.getLogger("orbit.node")

# How often the node row's heartbeat is refreshed (operators' view only; it decides nothing).
NODE_HEARTBEAT_S = 10.0
# How often a node on a multi-host DSN reads the cluster's writer record (db/hosts.py).
WRITER_CHECK_S = 1.0


@attrs.define(eq=False)
class Node:
    config: NodeConfig
    node_id: str = attrs.field(factory=random_id)
    db: Database = attrs.field(init=False)
    # One database per ORBIT_SHARDS database other than ORBIT_MYSQL_DSN's (config.shard_dsns).
    shard_dbs: tuple[Database, ...] = attrs.field(init=False)
    state: NodeState = attrs.field(init=False)
    bound: list[str] = attrs.field(factory=list, init=False)
    # Addresses of the open metrics server (ORBIT_METRICS=open), once listening.
    metrics_bound: list[str] = attrs.field(factory=list, init=False)
    _shutdown: trio.Event = attrs.field(factory=trio.Event, init=False)
    # When shutdown was requested (trio's clock): the grace period counts from here.
    _shutdown_at: float | None = attrs.field(default=None, init=False)
    # The background services this node runs (``services.default_services()`` in production).
    services: ServiceSet = ServiceSet()

    def __attrs_post_init__(self) -> None:
        self.db, *shard_dbs = (
            Database(dsn, size=self.config.db_pool_size, operation_timeout_s=self.config.db_operation_timeout_s)
            for dsn in (self.config.dsn, *self.config.shard_dsns)
        )
        self.shard_dbs = tuple(shard_dbs)
        self.state = NodeState.build(
            config=self.config,
            db=self.db,
            shard_dbs=self.shard_dbs,
            node_id=self.node_id,
            run=self.services,
            shutdown_requested=self._shutdown,
        )
        for db in self.databases:
            db.on_replay = self.state.metrics.observe_replay

    @property
    def databases(self) -> tuple[Database, ...]:
        """Every database this node uses: ORBIT_MYSQL_DSN's, then the other shards'."""
        return (self.db, *self.shard_dbs)

    def request_shutdown(self) -> None:
        self._shutdown.set()

    async def _shutdown_trigger(self) -> None:
        """Hypercorn's shutdown trigger: returns on ``request_shutdown()``, noting when (the
        grace period counts from there)."""
        await self._shutdown.wait()
        self._shutdown_at = trio.current_time()

    def _hypercorn_config(self) -> HypercornConfig:
        hc = HypercornConfig()
        hc.bind = [f"{self.config.http_host}:{self.config.http_port}"]
        if self.config.tls_cert:
            hc.certfile = self.config.tls_cert
            hc.keyfile = self.config.tls_key
        hc.accesslog = None
        hc.errorlog = logging.getLogger("orbit.hypercorn")
        hc.graceful_timeout = self.config.shutdown_grace_s
        hc.websocket_max_message_size = self.config.max_ws_message_bytes
        hc.h11_max_incomplete_size = 64 * 1024
        hc.include_server_header = False
        return hc

    async def _heartbeat(self) -> None:
        while True:
            await trio.sleep(NODE_HEARTBEAT_S)
            for db in self.databases:
                try:
                    await NodeStore(db).heartbeat(self.node_id)
                except Exception as exc:  # the database may be down; readiness reports it
                    log.warning("node heartbeat failed: %s", exc)

    async def _follow_writer(self, db: Database) -> None:
        while True:
            await trio.sleep(WRITER_CHECK_S)
            try:
                await db.check_writer()
            except Exception as exc:  # the pool moves on by itself when its server is lost
                log.debug("database writer check failed: %s", exc)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve until ``request_shutdown()``; reports the bound addresses when listening."""
        # The node is registered on every shard: each shard's operator reads (its Worker
        # connections, claim turns and explanations) join its own `nodes` table.
        for db in self.databases:
            try:
                with trio.move_on_after(5):
                    await NodeStore(db).register(
                        self.node_id,
                        hostname=socket.gethostname(),
                        http_addr=f"{self.config.http_host}:{self.config.http_port}",
                        version=__version__,
                    )
            except Exception as exc:
                log.warning("node registration failed (continuing; readiness reports the database): %s", exc)
        app = create_app(self.state)
        served = trio.Event()

        async def serve_http(task_status=trio.TASK_STATUS_IGNORED):
            try:
                # Returns once the shutdown trigger fired and hypercorn's graceful
                # drain (graceful_timeout) is over.
                await serve(
                    app, self._hypercorn_config(), shutdown_trigger=self._shutdown_trigger, task_status=task_status
                )
            finally:
                served.set()

        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.state.services.run, self._shutdown)
                nursery.start_soon(self._heartbeat)
                for db in self.databases:
                    if db.order.several:
                        nursery.start_soon(self._follow_writer, db)
                if self.config.metrics == "open":
                    self.metrics_bound = await nursery.start(
                        serve_metrics, self.state.metrics, self.config.metrics_host, self.config.metrics_port
                    )
                    log.info("metrics served on %s", ", ".join(f"{url}/metrics" for url in self.metrics_bound))
                self.bound = await nursery.start(serve_http)
                task_status.started(self.bound)
                await served.wait()
                if self._shutdown.is_set():
                    asked = trio.current_time() if self._shutdown_at is None else self._shutdown_at
                    await self.state.services.drain(asked + self.config.shutdown_grace_s)
                    log.info("drain ended: HTTP, Worker connections and claims done; stopping the background services")
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                for db in self.databases:
                    try:
                        await NodeStore(db).stopped(self.node_id)
                    except Exception:
                        pass
                for db in self.databases:
                    await db.aclose()

    @property
    def shutdown_requested(self) -> trio.Event:
        return self._shutdown
