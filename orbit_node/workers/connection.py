"""One Worker connection: its control loop, separate from its claim request.

Per connection, one nursery with:
* the reader: parses frames, answers heartbeats at once, queues transitions;
* the transition loop: start / renew / finish / release, in order, through the
  dispatch store (this is the only place the connection waits on SQL);
* the writer: the only task that sends frames;
* the watchdog: closes a silent connection after ``heartbeat_timeout_s`` and
  retries a claim request the scheduler refused;
* the shutdown watch: on node shutdown, tells the Worker to drain.

Claims are never awaited here: when the connection has free capacity and no
outstanding request, it hands one ``ClaimRequest`` to the node's ``ClaimPool`` and
goes on; the result arrives through ``_deliver``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, Protocol

import attrs
import trio

from .. import logs
from ..dispatch.pool import ClaimPool, PoolClosed
from ..claims import ClaimRequest
from ..dispatch.scheduler import SchedulerRefused
from ..errors import NotFound, OrbitError
from ..store.tenancy import Principal
from . import protocol as p

log = logging.getLogger("orbit.workers")

# Protocol errors tolerated on one connection before it is closed.
MAX_PROTOCOL_ERRORS = 16
# Transition messages queued per connection before new ones are refused.
MAX_QUEUED_TRANSITIONS = 256
# Bound on the shielded clean-up (releasing reservations) when a connection ends.
CLEANUP_TIMEOUT_S = 5.0


class ConnectionClosed(Exception):
    """The peer closed the WebSocket (or it broke)."""


class Transport(Protocol):
    async def receive(self) -> str | bytes: ...
    async def send(self, text: str) -> None: ...
    async def close(self, code: int, reason: str) -> None: ...


@attrs.define
class Held:
    token: str
    state: str  # reserved | running
    queue_id: str
    # trio time the dispatch was sent (metrics: dispatch -> Start latency).
    dispatched_at: float = 0.0


@attrs.define(eq=False)
class WorkerConnection:
    connection_id: str
    principal: Principal
    transport: Transport
    hub: Any  # WorkerHub: config, node_id, store, pool, tenancy, registry, shutdown event
    hello: p.Hello | None = None
    held: dict[str, Held] = attrs.field(factory=dict)
    outstanding: bool = False
    worker_draining: bool = False
    node_draining: bool = False
    protocol_errors: int = 0
    last_received: float = 0.0
    retry_claim_at: float | None = None
    _out_send: Any = None
    _out_recv: Any = None
    _tr_send: Any = None
    _tr_recv: Any = None
    _closing: tuple[int, str] | None = None
    _wake_watchdog: trio.Event = attrs.field(factory=trio.Event)
    _held_changed: trio.Event = attrs.field(factory=trio.Event)
    _nursery: trio.Nursery | None = None

    def __attrs_post_init__(self):
        self._out_send, self._out_recv = trio.open_memory_channel(math.inf)
        self._tr_send, self._tr_recv = trio.open_memory_channel(MAX_QUEUED_TRANSITIONS)

    # -- plumbing ---------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        """Queue a frame for the writer (never blocks)."""
        try:
            self._out_send.send_nowait(p.dumps(message))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def close_soon(self, code: int, reason: str) -> None:
        """Ask the writer to send what is queued, then close with ``code``."""
        if self._closing is None:
            self._closing = (code, reason)
            self._out_send.close()

    async def _writer(self) -> None:
        async for text in self._out_recv:
            await self.transport.send(text)
        code, reason = self._closing or (p.CLOSE_NORMAL, "")
        with trio.move_on_after(2):
            await self.transport.close(code, reason)
        raise ConnectionClosed(reason)

    # -- the connection's life ----------------------------------------------------------

    async def serve(self) -> None:
        self.last_received = trio.current_time()
        # Every line this connection's tasks log names it and its application.
        logs.bind(
            connection_id=self.connection_id,
            application=self.principal.application,
            namespace_id=self.principal.namespace_id,
        )
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                nursery.start_soon(self._transitions)
                nursery.start_soon(self._watchdog)
                nursery.start_soon(self._shutdown_watch)
                await self._reader()
                nursery.cancel_scope.cancel()
        except* ConnectionClosed:
            pass
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT_S):
                await self._cleanup()

    async def _cleanup(self) -> None:
        self.hub.pool.leave(self.connection_id)
        unstarted = [(task_id, h.token) for task_id, h in self.held.items() if h.state == "reserved"]
        if unstarted:
            try:
                await self.hub.store.release_many(unstarted)
            except Exception as exc:
                log.warning("connection %s: could not release %d reservations (lease recovery will): %s",
                            self.connection_id, len(unstarted), exc)
        # Running tasks stay with their lease: the Worker may still be running them;
        # if it never reports, lease recovery counts a failed attempt.
        await self.hub.unregister(self)

    async def _reader(self) -> None:
        while True:
            try:
                data = await self.transport.receive()
            except ConnectionClosed:
                return
            self.last_received = trio.current_time()
            try:
                message = p.parse_message(data)
                await self._handle(message)
            except p.ProtocolError as exc:
                self.protocol_errors += 1
                self.send(p.error(exc.code, exc.message, exc.field))
                if exc.close_code is not None:
                    self.close_soon(exc.close_code, exc.code)
                elif self.protocol_errors > MAX_PROTOCOL_ERRORS:
                    self.close_soon(p.CLOSE_PROTOCOL, "too many protocol errors")

    async def _handle(self, message: p.Message) -> None:
        if isinstance(message, p.Heartbeat):
            self.send(p.heartbeat())
            return
        if self.hello is None:
            if not isinstance(message, p.Hello):
                raise p.ProtocolError("OUT_OF_ORDER", "the first message must be hello", field="type",
                                      close_code=p.CLOSE_PROTOCOL)
            await self._accept_hello(message)
            return
        if isinstance(message, p.Hello):
            raise p.ProtocolError("OUT_OF_ORDER", "hello was already received", field="type")
        if isinstance(message, p.Drain):
            self.worker_draining = True
            self.hub.pool.leave(self.connection_id)
            self.outstanding = False
            return
        try:
            self._tr_send.send_nowait(message)
        except trio.WouldBlock:
            # Refused as a whole: a negative ack per task (with the message id) so the
            # Worker can retry it; nothing was changed.
            kind = type(message).__name__.lower()
            self.send(p.ack(kind, [{"task_id": t.task_id, "ok": False, "code": "RESOURCE_EXHAUSTED"}
                                   for t in message.tasks], message.id))

    async def _accept_hello(self, hello: p.Hello) -> None:
        for index, queue_id in enumerate(hello.queues):
            if not self.principal.allows("workers:consume", queue_id):
                raise p.ProtocolError("PERMISSION_DENIED", f"credential lacks workers:consume for queue {queue_id}",
                                      field=f"queues[{index}]", close_code=p.CLOSE_POLICY)
            try:
                await self.hub.tenancy.get_queue(self.principal.namespace_id, queue_id)
            except NotFound:
                raise p.ProtocolError("NOT_FOUND", f"queue {queue_id} not found", field=f"queues[{index}]",
                                      close_code=p.CLOSE_POLICY) from None
            except OrbitError as exc:
                raise p.ProtocolError("UNAVAILABLE", exc.message, close_code=p.CLOSE_INTERNAL) from None
        self.hello = hello
        await self.hub.register(self)
        config = self.hub.config
        self.send(p.welcome(
            connection_id=self.connection_id,
            node_id=self.hub.node_id,
            heartbeat_interval_s=config.heartbeat_timeout_s / 3,
            heartbeat_timeout_s=config.heartbeat_timeout_s,
            max_message_bytes=config.max_ws_message_bytes,
            reservation_lease_s=config.reservation_lease_s,
            run_lease_s=config.run_lease_s,
        ))
        self.maybe_request_claim()

    # -- claims -----------------------------------------------------------------------

    @property
    def free_capacity(self) -> int:
        return 0 if self.hello is None else self.hello.capacity - len(self.held)

    def maybe_request_claim(self) -> None:
        if (self.hello is None or self.outstanding or self.worker_draining or self.node_draining
                or self._closing is not None or self.free_capacity <= 0):
            return
        request = ClaimRequest(
            connection_id=self.connection_id,
            node_id=self.hub.node_id,
            application_id=self.principal.application_id,
            namespace_id=self.principal.namespace_id,
            queue_ids=self.hello.queues,
            capabilities=self.hello.capabilities,
            resource_key_support=self.hello.resource_keys,
            limit=min(self.free_capacity, self.hub.config.claim_batch_size),
        )
        try:
            self.hub.pool.request(request, self._deliver)
        except SchedulerRefused:
            self.retry_claim_at = trio.current_time() + self.hub.config.scheduler.scan_cycle_s
            self._wake_watchdog.set()
            return
        except PoolClosed:
            return
        self.outstanding = True

    def _deliver(self, result: Sequence[Any] | BaseException) -> None:
        self.outstanding = False
        self._held_changed.set()
        if isinstance(result, BaseException):
            if not isinstance(result, PoolClosed):
                self.retry_claim_at = trio.current_time() + self.hub.config.scheduler.scan_cycle_s
                self._wake_watchdog.set()
            return
        if result:
            now = trio.current_time()
            for r in result:
                self.held[r.task_id] = Held(r.fencing_token, "reserved", r.queue_id, now)
            self.send(p.dispatch(result))
            self.hub.observe_dispatch(result)
        self.maybe_request_claim()

    # -- transitions --------------------------------------------------------------------

    async def _transitions(self) -> None:
        async for message in self._tr_recv:
            try:
                await self._transition(message)
            except OrbitError as exc:
                # The database could not be reached: every task of the message gets a
                # negative ack the Worker can retry; nothing changed ownership.
                kind = type(message).__name__.lower()
                self.send(p.ack(kind, [{"task_id": t.task_id, "ok": False, "code": exc.code} for t in message.tasks],
                                message.id))
            self._held_changed.set()
            self.maybe_request_claim()

    def _split_held(self, refs, states: tuple[str, ...]):
        """Tasks this connection holds (in the given states) vs. the ones it does not."""
        mine, refused = [], []
        for ref in refs:
            held = self.held.get(ref.task_id)
            if held is not None and held.token == ref.token and held.state in states:
                mine.append(ref)
            else:
                refused.append({"task_id": ref.task_id, "ok": False, "code": "NOT_HELD"})
        return mine, refused

    async def _transition(self, message) -> None:
        store = self.hub.store
        if isinstance(message, p.Start):
            mine, results = self._split_held(message.tasks, ("reserved",))
            outcomes = await store.start_many([(r.task_id, r.token) for r in mine]) if mine else []
            for ref, outcome in zip(mine, outcomes):
                result = self.hub.result_json(outcome)
                results.append(result)
                if result["ok"]:
                    held = self.held[ref.task_id]
                    held.state = "running"
                    self.hub.observe_started(trio.current_time() - held.dispatched_at)
                else:
                    self.held.pop(ref.task_id, None)
            self.send(p.ack("start", results, message.id))
        elif isinstance(message, p.Renew):
            mine, results = self._split_held(message.tasks, ("reserved", "running"))
            outcomes = await store.renew_many([(r.task_id, r.token) for r in mine]) if mine else []
            cancels = []
            for ref, outcome in zip(mine, outcomes):
                result = self.hub.result_json(outcome)
                results.append(result)
                if not result["ok"]:
                    self.held.pop(ref.task_id, None)
                elif outcome.cancel_requested:
                    cancels.append((ref.task_id, "cancel_requested"))
                elif outcome.deadline_passed:
                    cancels.append((ref.task_id, "deadline"))
            self.send(p.ack("renew", results, message.id))
            if cancels:
                self.send(p.cancel(cancels))
        elif isinstance(message, p.Finish):
            mine, results = self._split_held(message.tasks, ("running",))
            outcomes = await store.finish_many([self.hub.finish_item(r) for r in mine]) if mine else []
            for ref, outcome in zip(mine, outcomes):
                results.append(self.hub.result_json(outcome))
                self.held.pop(ref.task_id, None)
            self.hub.observe_finish(outcomes)
            self.send(p.ack("finish", results, message.id))
        elif isinstance(message, p.Release):
            mine, results = self._split_held(message.tasks, ("reserved",))
            outcomes = await store.release_many([(r.task_id, r.token) for r in mine]) if mine else []
            for ref, outcome in zip(mine, outcomes):
                results.append(self.hub.result_json(outcome))
                self.held.pop(ref.task_id, None)
            self.send(p.ack("release", results, message.id))

    # -- timers -------------------------------------------------------------------------

    async def _watchdog(self) -> None:
        timeout = self.hub.config.heartbeat_timeout_s
        while True:
            now = trio.current_time()
            if now - self.last_received >= timeout:
                self.send(p.error("HEARTBEAT_TIMEOUT", f"nothing received for {timeout:g} s"))
                self.close_soon(p.CLOSE_HEARTBEAT_TIMEOUT, "heartbeat timeout")
                return
            if self.retry_claim_at is not None and now >= self.retry_claim_at:
                self.retry_claim_at = None
                self.maybe_request_claim()
            deadline = self.last_received + timeout
            if self.retry_claim_at is not None:
                deadline = min(deadline, self.retry_claim_at)
            self._wake_watchdog = trio.Event()
            with trio.move_on_at(deadline):
                await self._wake_watchdog.wait()

    async def _shutdown_watch(self) -> None:
        await self.hub.shutdown_requested.wait()
        # No new requests from here on; the pool's own shutdown answers a pending one
        # (PoolClosed) and lets an in-flight one deliver its reservations here.
        self.node_draining = True
        self.send(p.drain())
        # The Worker finishes what runs and releases what it has not started; an
        # in-flight claim still delivers first. The node's grace period bounds the wait,
        # then clean-up releases whatever reservations are left.
        while self.held or self.outstanding:
            self._held_changed = trio.Event()
            await self._held_changed.wait()
        self.close_soon(p.CLOSE_GOING_AWAY, "node shutting down")
