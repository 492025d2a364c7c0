"""The node's Worker side: admission, the connection registry, and the claim pool service."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol

import attrs
import trio

from ..config import NodeConfig
from ..dispatch.claim_pool import ClaimPool
from ..dispatch.signals import SignalRelay
from ..domain.ownership import Reservation, TransitionResult
from ..store.tenancy import Principal, TenancyStore
from ..store.worker_registry import WorkerRegistryStore
from .connection import TransitionStore, Transport, WorkerConnection
from .slots import REFUSAL_REASONS, Refused, decide
from .table import ConnectionTable

log = logging.getLogger("orbit.workers")

# How often this node refreshes heartbeat_at of its connections in the registry.
REGISTRY_HEARTBEAT_S = 10.0
# Bound on one registry write that a closing connection lets finish.
REGISTRY_WRITE_TIMEOUT_S = 5.0


def _ignore(*args: object) -> None:
    """A hook nobody listens to."""


class ApplicationShards(Protocol):
    """The stores of an application's shard (``services.Shards``)."""

    def transitions_for(self, application_id: str) -> TransitionStore: ...
    def tenancy_for(self, application_id: str) -> TenancyStore: ...
    def registry_for(self, application_id: str) -> WorkerRegistryStore: ...
    def registries(self) -> Sequence[WorkerRegistryStore]: ...
    def signals_for(self, application_id: str) -> SignalRelay | None: ...
    def tasks_finished(self, application_id: str, task_ids: Sequence[str]) -> None: ...


@attrs.define(eq=False)
class Slot:
    """One admitted connection's slot, from the handshake until the connection ends (or is
    moved away to make room, which hands the slot to the newcomer at once)."""

    application_id: str
    connection: WorkerConnection | None = None
    # Given back (the connection ended) or handed over (it was moved away).
    released: bool = False


@attrs.define(eq=False)
class WorkerHub:
    config: NodeConfig
    node_id: str
    pool: ClaimPool
    # Where each application's transitions, queues and registry rows are.
    shards: ApplicationShards
    shutdown_requested: trio.Event
    # A Start was accepted this many seconds after its dispatch (metrics hook).
    on_start: Callable[[float], None] = _ignore
    # A connection of (application id, application name) was admitted (metrics labels).
    on_application: Callable[[str, str], None] = _ignore
    # The live connections (shared with the shards' signals).
    table: ConnectionTable = attrs.field(factory=ConnectionTable)
    admitted: int = 0
    # Refused connections by reason (``slots.REFUSAL_REASONS``).
    refusals: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(REFUSAL_REASONS, 0))
    # Connections moved away to make room for an application under its fair share.
    moved: int = 0
    # Slots taken per application (connections past the handshake, hello or not).
    held: dict[str, int] = attrs.field(factory=dict)
    _slots: list[Slot] = attrs.field(factory=list, init=False)
    dispatched: int = 0
    finished: dict[str, int] = attrs.field(factory=dict)
    # Waiting tasks released by the Finishes of their last parents.
    released: int = 0

    @property
    def connections(self) -> dict[str, WorkerConnection]:
        return self.table.connections

    @property
    def cancels_pushed(self) -> int:
        return self.table.cancels_pushed

    # -- admission ---------------------------------------------------------------------

    @property
    def refused(self) -> int:
        return sum(self.refusals.values())

    def admit(self, principal: Principal) -> Slot | Refused:
        """A slot for a new connection of ``principal``, or why not (``slots.decide``):
        on a full node, a connection of the application most over its fair share is moved
        away (``WorkerConnection.move_away``) and its slot is the newcomer's."""
        app = principal.application_id
        evictable: dict[str, int] = {}
        for slot in self._slots:
            if self._movable(slot):
                evictable[slot.application_id] = evictable.get(slot.application_id, 0) + 1
        decision = decide(
            app,
            self.held,
            slots=self.config.max_connections,
            weight=self.pool.scheduler.weight,
            limit=principal.max_worker_connections,
            evictable=evictable,
        )
        if isinstance(decision, Refused):
            self.refusals[decision.reason] += 1
            return decision
        if decision.evict is not None:
            self._move_one(decision.evict)
        self.on_application(app, principal.application)
        slot = Slot(app)
        self._slots.append(slot)
        self.held[app] = self.held.get(app, 0) + 1
        self.admitted += 1
        return slot

    def _movable(self, slot: Slot) -> bool:
        conn = slot.connection
        return not slot.released and conn is not None and conn.connection_id in self.connections

    def _move_one(self, application_id: str) -> None:
        """Move away the connection of ``application_id`` holding the fewest tasks (the
        newest among those): it is told to drain and closes with ``CLOSE_MOVED``."""
        candidates = [s for s in self._slots if s.application_id == application_id and self._movable(s)]
        slot = min(reversed(candidates), key=lambda s: len(s.connection.core.held) if s.connection else 0)
        self.release(slot)
        self.moved += 1
        assert slot.connection is not None
        log.info(
            "connection %s of application %s moved away: the node is full and another application is under its share",
            slot.connection.connection_id,
            slot.connection.principal.application,
        )
        slot.connection.move_away()

    def release(self, slot: Slot) -> None:
        """Give ``slot`` back (once: a moved connection's slot was handed over already)."""
        if slot.released:
            return
        slot.released = True
        self._slots.remove(slot)
        self.admitted -= 1
        left = self.held[slot.application_id] - 1
        if left:
            self.held[slot.application_id] = left
        else:
            del self.held[slot.application_id]

    def transitions_for(self, application_id: str) -> TransitionStore:
        """Where the transitions of a connection of ``application_id`` go: its lane of its
        shard's group commit (one application per transaction), or that shard's store."""
        return self.shards.transitions_for(application_id)

    def queues_for(self, application_id: str) -> TenancyStore:
        """Where the queues of ``application_id`` are (its shard)."""
        return self.shards.tenancy_for(application_id)

    def connection(self, principal: Principal, transport: Transport, slot: Slot | None = None) -> WorkerConnection:
        """A new connection of ``principal`` over ``transport``, served by this node: its
        transitions and queues are its application's shard's; it reports to this hub; it
        holds ``slot`` (from ``admit``)."""
        conn = WorkerConnection(
            "c_" + secrets.token_hex(12),
            principal,
            transport,
            config=self.config,
            node_id=self.node_id,
            pool=self.pool,
            shutdown_requested=self.shutdown_requested,
            transitions=self.transitions_for(principal.application_id),
            queues=self.queues_for(principal.application_id),
            registry=self,
            observer=self,
        )
        if slot is not None:
            slot.connection = conn
        return conn

    # -- the registry of live connections ------------------------------------------------

    async def register(self, conn: WorkerConnection) -> None:
        hello = conn.hello
        assert hello is not None  # a connection registers once its hello is accepted
        self.connections[conn.connection_id] = conn
        self.on_application(conn.principal.application_id, conn.principal.application)
        log.info(
            "worker connected: %d queues, capacity %d, client %s %s",
            len(hello.queues),
            hello.capacity,
            hello.client_name or "-",
            hello.client_version or "-",
        )
        try:
            # Finished even when the connection ends meanwhile (bounded): a write cut off
            # mid-statement costs a database session (the server logs it as aborted).
            with trio.CancelScope(shield=True), trio.move_on_after(REGISTRY_WRITE_TIMEOUT_S):
                await self.shards.registry_for(conn.principal.application_id).add(
                    connection_id=conn.connection_id,
                    node_id=self.node_id,
                    namespace_id=conn.principal.namespace_id,
                    queues=hello.queues,
                    capabilities=hello.capabilities,
                    resource_key_support=hello.resource_keys,
                    capacity=hello.capacity,
                    client_name=hello.client_name,
                    client_version=hello.client_version,
                )
        except Exception as exc:  # the registry informs operators; it decides nothing
            log.warning("could not record connection %s: %s", conn.connection_id, exc)

    async def unregister(self, conn: WorkerConnection) -> None:
        if self.connections.pop(conn.connection_id, None) is not None:
            log.info("worker disconnected")
            try:
                await self.shards.registry_for(conn.principal.application_id).remove(conn.connection_id)
            except Exception as exc:
                log.warning("could not remove connection %s from the registry: %s", conn.connection_id, exc)

    def tasks_requeued(
        self, application_id: str, queue_id: str, due_at: datetime | None, due_in_s: float | None
    ) -> None:
        """A Worker's release or failed attempt put tasks of ``queue_id`` back, due at
        ``due_at`` (None: now), ``due_in_s`` from now: the waiting claims of every node
        hear of it."""
        signals = self.shards.signals_for(application_id)
        if signals is not None:
            signals.tasks_arrived(queue_id, due_at, due_in_s)
        elif due_at is None:
            self.pool.task_arrived(queue_id)

    def tasks_finished(self, application_id: str, task_ids: Sequence[str]) -> None:
        """A Worker's transitions ended these tasks: the requests waiting for them, on this
        node and the others, answer now."""
        self.shards.tasks_finished(application_id, task_ids)

    # -- what the connections report --------------------------------------------------

    def observe_dispatch(self, reservations: Sequence[Reservation]) -> None:
        self.dispatched += len(reservations)

    def observe_started(self, seconds: float) -> None:
        """A Start was accepted ``seconds`` after its task was dispatched."""
        self.on_start(seconds)

    def observe_finish(self, results: Sequence[TransitionResult]) -> None:
        for result in results:
            if result.duplicate:
                continue  # a repeated Finish changed nothing
            self.finished[result.outcome.value] = self.finished.get(result.outcome.value, 0) + 1
            self.released += len(result.released)

    # -- the service ---------------------------------------------------------------------

    async def run(self) -> None:
        """Refresh this node's rows in the Worker registry (of every shard) until cancelled."""
        while True:
            await trio.sleep(REGISTRY_HEARTBEAT_S)
            for registry in self.shards.registries():
                try:
                    await registry.heartbeat_node(self.node_id)
                except Exception as exc:
                    log.warning("registry heartbeat failed: %s", exc)
