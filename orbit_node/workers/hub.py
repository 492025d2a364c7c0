"""The node's Worker side: admission, the connection registry, and the claim pool service."""

from __future__ import annotations

import logging
import secrets
from typing import Any

import attrs
import trio

from ..config import NodeConfig
from ..dispatch.pool import ClaimPool
from ..dispatch.scheduler import FairScheduler
from ..metrics import TurnRecorder
from ..store import dispatch as ds
from ..store.operations import OperationsStore
from ..store.tenancy import TenancyStore
from ..store.workers import WorkerRegistryStore
from . import protocol as p

log = logging.getLogger("orbit.workers")

# How often this node refreshes heartbeat_at of its connections in the registry.
REGISTRY_HEARTBEAT_S = 10.0


@attrs.define(eq=False)
class WorkerHub:
    config: NodeConfig
    node_id: str
    store: Any  # DispatchStore
    pool: ClaimPool
    tenancy: TenancyStore
    registry: WorkerRegistryStore
    shutdown_requested: trio.Event
    connections: dict[str, Any] = attrs.field(factory=dict)
    admitted: int = 0
    refused: int = 0
    dispatched: int = 0
    finished: dict[str, int] = attrs.field(factory=dict)
    # The node's metrics (``orbit_node.metrics.NodeMetrics``), when it has any.
    metrics: Any = None

    # -- admission ---------------------------------------------------------------------

    def try_admit(self) -> bool:
        """Reserve a connection slot; False when the node already has its maximum."""
        if self.admitted >= self.config.max_connections:
            self.refused += 1
            return False
        self.admitted += 1
        return True

    def release_slot(self) -> None:
        self.admitted -= 1

    @staticmethod
    def new_connection_id() -> str:
        return "c_" + secrets.token_hex(12)

    async def register(self, conn) -> None:
        self.connections[conn.connection_id] = conn
        if self.metrics is not None:
            self.metrics.note_application(conn.principal.application_id, conn.principal.application)
        log.info(
            "worker connected: %d queues, capacity %d, client %s %s", len(conn.hello.queues), conn.hello.capacity,
            conn.hello.client_name or "-", conn.hello.client_version or "-",
        )
        try:
            await self.registry.add(
                connection_id=conn.connection_id,
                node_id=self.node_id,
                namespace_id=conn.principal.namespace_id,
                queues=conn.hello.queues,
                capabilities=conn.hello.capabilities,
                resource_key_support=conn.hello.resource_keys,
                client_name=conn.hello.client_name,
                client_version=conn.hello.client_version,
            )
        except Exception as exc:  # the registry informs operators; it decides nothing
            log.warning("could not record connection %s: %s", conn.connection_id, exc)

    async def unregister(self, conn) -> None:
        if self.connections.pop(conn.connection_id, None) is not None:
            log.info("worker disconnected")
            try:
                await self.registry.remove(conn.connection_id)
            except Exception as exc:
                log.warning("could not remove connection %s from the registry: %s", conn.connection_id, exc)

    # -- translation between the protocol and the dispatch store ------------------------

    @staticmethod
    def finish_item(report: p.FinishReport) -> ds.FinishItem:
        return ds.FinishItem(
            task_id=report.task_id,
            token=report.token,
            result_json=report.result_json,
            error=dict(report.error) if report.error is not None else None,
            retryable=report.retryable,
        )

    @staticmethod
    def result_json(result: ds.TransitionResult) -> dict[str, Any]:
        """One ``ack`` result for a store transition result."""
        body: dict[str, Any] = {"task_id": result.task_id, "ok": result.ok}
        if not result.ok:
            body["code"] = result.code
        if result.state is not None:
            body["state"] = result.state
        if result.ok and result.lease_expires_at is not None:
            body["lease_expires_at"] = p.timestamp(result.lease_expires_at)
        if result.ok and result.outcome in (ds.Outcome.STARTED, ds.Outcome.RENEWED):
            body["cancel_requested"] = bool(result.cancel_requested or result.deadline_passed)
        return body

    def observe_dispatch(self, reservations) -> None:
        self.dispatched += len(reservations)

    def observe_started(self, seconds: float) -> None:
        """A Start was accepted ``seconds`` after its task was dispatched."""
        if self.metrics is not None:
            self.metrics.observe_start(seconds)

    def observe_finish(self, results) -> None:
        for result in results:
            if result.duplicate:
                continue  # a repeated Finish changed nothing
            self.finished[result.outcome.value] = self.finished.get(result.outcome.value, 0) + 1


async def worker_service(node, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Start the dispatch store, the fair claim pool and the Worker hub of a node."""
    config = node.config
    store = ds.DispatchStore(
        node.db,
        reservation_lease_s=config.reservation_lease_s,
        run_lease_s=config.run_lease_s,
        batch_size=config.claim_batch_size,
    )
    metrics = node.state.metrics
    pool = ClaimPool(
        FairScheduler(config.scheduler), claim=store.claim, release=store.release_many, observe=metrics.observe_claim
    )
    hub = WorkerHub(
        config=config,
        node_id=node.node_id,
        store=store,
        pool=pool,
        tenancy=node.state.tenancy,
        registry=WorkerRegistryStore(node.db),
        shutdown_requested=node.shutdown_requested,
        metrics=metrics,
    )
    # Claim turns go to the database too: operators see every node's rotation in one place.
    turns = TurnRecorder(OperationsStore(node.db), node.node_id, lambda: pool.scheduler.statistics().turns_by_application)
    node.state.services.update(workers=hub, claims=pool, dispatch=store, turns=turns)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        nursery.start_soon(_registry_heartbeat, hub)
        await nursery.start(turns.run)
        task_status.started(hub)
        await node.shutdown_requested.wait()
        # Phase 1 of shutdown: pending claims are cancelled, in-flight ones finish and
        # deliver; connections are told to drain by their own shutdown watch.
        pool.close()
        nursery.cancel_scope.deadline = trio.current_time() + config.shutdown_grace_s + 1


async def _registry_heartbeat(hub: WorkerHub) -> None:
    while True:
        await trio.sleep(REGISTRY_HEARTBEAT_S)
        try:
            await hub.registry.heartbeat_node(hub.node_id)
        except Exception as exc:
            log.warning("registry heartbeat failed: %s", exc)
