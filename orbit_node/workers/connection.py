"""One Worker connection: its control loop, separate from its claim request.

Per connection, one nursery with:
* the reader: parses frames, answers heartbeats at once, queues transitions;
* the transition loop: start / renew / finish / release, in order, through the
  lease store (this is the only place the connection waits on SQL);
* the writer: the only task that sends frames, from the send buffer the core bounds by
  messages and bytes (a Worker that leaves more unread is closed as a slow consumer);
* the watchdog: closes a silent connection after ``heartbeat_timeout_s`` and
  retries a claim request the scheduler refused;
* the drain watch: on node shutdown, or when the node moves the connection away to make
  room for another application (``move_away``), tells the Worker to drain.

What the protocol decides (hello first and once, the budget of protocol errors, when
silence ends the connection, when to ask for a claim and for how many, whether a frame
fits the send buffer) is the pure ``ConnectionCore``'s; this adapter awaits what it says.

Claims are never awaited here: when the connection has free capacity and no
outstanding request, it hands one ``ClaimRequest`` to the node's ``ClaimPool`` and
goes on; the result arrives through ``_deliver``.

Of the node, a connection is given values (the settings, the node id, the claim pool,
the shutdown event, its application's ``TransitionStore`` and ``QueueLookup``) and two
narrow protocols: the ``Registry`` of live connections and the ``Observer`` of what it
reports. ``WorkerHub`` is both and builds connections (``WorkerHub.connection``).

What the connection holds, when it asks for a claim and when a drain is done are
decided by ``core.ConnectionCore`` (sans-IO); this module only awaits and sends.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Protocol, cast

import attrs
import trio

from orbit_protocol import logs

from ..config import NodeConfig
from ..dispatch.claim_pool import ClaimPool, PoolClosed
from ..dispatch.scheduler import SchedulerRefused
from ..domain.claims import ClaimRequest
from ..domain.errors import NotFound, OrbitError
from ..domain.ownership import AttachItem, FinishItem, Reservation, TransitionResult
from ..domain.task_query import TERMINAL_STATES
from ..store.tenancy import Principal
from ..tracing import ConnectionTraces
from . import protocol as p
from .core import (
    Close,
    ConnectionCore,
    TaskHandle,
    TransitionKind,
    TransitionMessage,
    ack_result,
    finish_item,
    kind_of,
)
from .send_buffer import Frame, SendBuffer

log = logging.getLogger("orbit.workers")

# Transition messages queued per connection before new ones are refused.
MAX_QUEUED_TRANSITIONS = 256


class Internal(enum.Enum):
    """Work the node puts in a connection's transition loop itself."""

    # The node drains: give back the reservations not started.
    RELEASE_UNSTARTED = "release_unstarted"


RELEASE_UNSTARTED = Internal.RELEASE_UNSTARTED
# Bound on the shielded clean-up (releasing reservations) when a connection ends.
CLEANUP_TIMEOUT_S = 5.0
# Bound on the WebSocket close handshake once the queued frames are sent.
CLOSE_TIMEOUT_S = 2.0
# The close reason of a connection moved away to make room (docs/worker-protocol.md).
MOVED_REASON = "moved: node full, reconnect elsewhere"


class WorkerConnectionClosed(OrbitError):
    """The Worker connection is over; the subclasses say whose doing it was."""

    code = "CONNECTION_CLOSED"

    def __init__(self, reason: str = ""):
        super().__init__(reason or "connection closed")
        self.reason = reason


class ClosedByNode(WorkerConnectionClosed):
    """The node closed the connection with ``close_code`` (timeout, protocol errors, shutdown)."""

    def __init__(self, reason: str, *, close_code: int):
        super().__init__(reason)
        self.close_code = close_code


class ConnectionBroken(WorkerConnectionClosed):
    """The peer closed the WebSocket, or it broke."""

    code = "CONNECTION_BROKEN"


class Transport(Protocol):
    """The connection's WebSocket. ``receive`` raises ``WorkerConnectionClosed`` once the peer is gone."""

    async def receive(self) -> str | bytes: ...
    async def send(self, text: str) -> None: ...
    async def close(self, code: int, reason: str) -> None: ...


class TransitionStore(Protocol):
    """The lease store's guarded transitions (``store.leases.LeaseStore``)."""

    async def start_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]: ...
    async def renew_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]: ...
    async def release_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]: ...
    async def finish_many(
        self, items: Iterable[FinishItem], *, recorded_only: str | None = None
    ) -> list[TransitionResult]: ...
    async def attach_many(self, items: Iterable[AttachItem]) -> list[TransitionResult]: ...


class QueueLookup(Protocol):
    """Checks a hello's queues exist (``store.tenancy.TenancyStore``); raises ``NotFound``."""

    async def get_queue(self, namespace_id: str, queue_id: str) -> object: ...


class Registry(Protocol):
    """The node's live connections (``WorkerHub``): a connection is in from its accepted
    hello to its end."""

    async def register(self, conn: WorkerConnection) -> None: ...
    async def unregister(self, conn: WorkerConnection) -> None: ...


class Observer(Protocol):
    """What a connection reports (``WorkerHub``): its tasks for the metrics, tasks it put
    back in their queues for the claims that wait for them, and tasks that finished for
    the requests that wait for them."""

    def observe_dispatch(self, reservations: Sequence[Reservation]) -> None: ...
    def observe_started(self, seconds: float) -> None: ...
    def observe_finish(self, results: Sequence[TransitionResult]) -> None: ...
    def tasks_requeued(
        self, application_id: str, queue_id: str, due_at: datetime | None, due_in_s: float | None
    ) -> None: ...
    def tasks_finished(self, application_id: str, task_ids: Sequence[str]) -> None: ...


@attrs.define(eq=False)
class WorkerConnection:
    """One Worker connection; ``WorkerHub.connection`` builds it with the node's parts."""

    connection_id: str
    principal: Principal
    transport: Transport
    config: NodeConfig = attrs.field(kw_only=True)
    node_id: str = attrs.field(kw_only=True)
    # The node's fair claim pool.
    pool: ClaimPool = attrs.field(kw_only=True)
    # Set once the node shuts down: the connection tells its Worker to drain.
    shutdown_requested: trio.Event = attrs.field(kw_only=True)
    # Where the Start/renew/Finish/release batches of this connection go (its application's
    # lane of the group commit), and where its hello's queues are looked up (its shard).
    transitions: TransitionStore = attrs.field(kw_only=True)
    queues: QueueLookup = attrs.field(kw_only=True)
    registry: Registry = attrs.field(kw_only=True)
    observer: Observer = attrs.field(kw_only=True)
    core: ConnectionCore = attrs.field(init=False)
    # Frames for the writer, as many as the core's send buffer lets through; queuing
    # never blocks (see ``send``).
    _out_send: trio.MemorySendChannel[Frame] = attrs.field(init=False)
    _out_recv: trio.MemoryReceiveChannel[Frame] = attrs.field(init=False)
    # Transitions for the transition loop, bounded by MAX_QUEUED_TRANSITIONS.
    _tr_send: trio.MemorySendChannel[TransitionMessage | Internal] = attrs.field(init=False)
    _tr_recv: trio.MemoryReceiveChannel[TransitionMessage | Internal] = attrs.field(init=False)
    _wake_watchdog: trio.Event = attrs.field(factory=trio.Event, init=False)
    # Set by ``move_away``: the node is full and needs this connection's slot.
    _moved: trio.Event = attrs.field(factory=trio.Event, init=False)
    _held_changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    # The spans of its tasks' dispatch, Start and Finish (nothing without a tracer provider).
    _traces: ConnectionTraces = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        config = self.config
        self.core = ConnectionCore(
            self.connection_id,
            self.principal.application_id,
            self.principal.namespace_id,
            claim_batch_size=config.claim_batch_size,
            retry_after_s=config.scheduler.scan_cycle_s,
            heartbeat_timeout_s=config.heartbeat_timeout_s,
            send_buffer=SendBuffer(config.worker_send_buffer_messages, config.worker_send_buffer_bytes),
        )
        self._out_send, self._out_recv = trio.open_memory_channel[Frame](math.inf)
        self._traces = ConnectionTraces(self.connection_id)
        self._tr_send, self._tr_recv = trio.open_memory_channel[TransitionMessage | Internal](MAX_QUEUED_TRANSITIONS)

    @property
    def hello(self) -> p.Hello | None:
        """The Worker's hello, once accepted."""
        return self.core.hello

    @property
    def buffered_messages(self) -> int:
        """Frames queued for the writer, not yet handed to the WebSocket."""
        return self.core.send_buffer.messages

    @property
    def buffered_bytes(self) -> int:
        """UTF-8 bytes of the frames queued for the writer."""
        return self.core.send_buffer.size

    @property
    def close_code(self) -> int | None:
        """The close code the node chose for this connection, once it chose one."""
        return None if self.core.closing is None else self.core.closing.code

    # -- plumbing ---------------------------------------------------------------------

    def send(self, message: p.NodeMessage) -> None:
        """Queue a frame for the writer (never blocks) as the core says: nothing once the
        connection closes; a frame that does not fit the send buffer closes it as a slow
        consumer."""
        frame = self.core.frame(message)
        if isinstance(frame, Close):
            self._close_slow_consumer(frame)
        elif frame is not None:
            self._out_send.send_nowait(frame)

    def _close_slow_consumer(self, close: Close) -> None:
        """Drop every frame the Worker has not read and close with ``close``.

        Its tasks follow the lease rules as on any other close: reservations are released
        when the connection ends, running tasks keep their lease."""
        log.warning(
            "connection %s: closed as a slow consumer (%d frames, %d bytes unread)",
            self.connection_id,
            self.buffered_messages,
            self.buffered_bytes,
        )
        self.close_soon(close.code, close.reason)
        while True:
            try:
                frame = self._out_recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            self.core.frame_left(frame)

    def move_away(self) -> None:
        """The node gave this connection's slot to another application's: drain the Worker
        as at shutdown (it finishes what runs, releases what it has not started), then close
        with ``CLOSE_MOVED`` so that it reconnects elsewhere. The wait is bounded by
        ``shutdown_grace_s``; running tasks left then keep their lease, as on any close."""
        self._moved.set()

    def close_soon(self, code: int, reason: str) -> None:
        """Ask the writer to send what is queued, then close with ``code``."""
        if self.core.start_closing(code, reason):
            self._out_send.close()

    async def _writer(self) -> None:
        async for frame in self._out_recv:
            self.core.frame_left(frame)
            await self.transport.send(frame.text)
        close = self.core.closing or Close(p.CLOSE_NORMAL, "")
        with trio.move_on_after(CLOSE_TIMEOUT_S):
            try:
                await self.transport.close(close.code, close.reason)
            except WorkerConnectionClosed:
                pass  # the peer went while the close frame was on its way
        raise ClosedByNode(close.reason, close_code=close.code)

    # -- the connection's life ----------------------------------------------------------

    async def serve(self) -> None:
        self.core.received(trio.current_time())
        # Every line this connection's tasks log names it and its application.
        logs.bind(
            connection_id=self.connection_id,
            application=self.principal.application,
            namespace_id=self.principal.namespace_id,
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer)
                nursery.start_soon(self._transitions)
                nursery.start_soon(self._watchdog)
                nursery.start_soon(self._drain_watch)
                await self._reader()
                nursery.cancel_scope.cancel()
        except* WorkerConnectionClosed:
            pass
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT_S):
                await self._cleanup()

    async def _cleanup(self) -> None:
        self.pool.leave(self.connection_id)
        unstarted = self.core.unstarted()
        if unstarted:
            try:
                await self.transitions.release_many(unstarted)
            except Exception as exc:
                log.warning(
                    "connection %s: could not release %d reservations (lease recovery will): %s",
                    self.connection_id,
                    len(unstarted),
                    exc,
                )
        # Running tasks stay with their lease: the Worker may still be running them;
        # if it never reports, lease recovery counts a failed attempt.
        await self.registry.unregister(self)

    async def _reader(self) -> None:
        while True:
            try:
                data = await self.transport.receive()
            except WorkerConnectionClosed:
                return
            self.core.received(trio.current_time())
            try:
                message = p.parse_message(data)
                await self._handle(message)
            except p.MessageRefused as exc:
                self.send(p.Error(exc.code, exc.message, exc.field))
                close = self.core.refused(exc)
                if close is not None:
                    self.close_soon(close.code, close.reason)

    async def _handle(self, message: p.Message) -> None:
        self.core.check_order(message)
        if isinstance(message, p.Heartbeat):
            self.send(p.Heartbeat())
            return
        if isinstance(message, p.Hello):
            await self._accept_hello(message)
            return
        if isinstance(message, p.Drain):
            # No claim after this: the pool drops a pending request and releases what an
            # in-flight one reserves, so no dispatch follows the ack. Repeated, it is
            # acknowledged again.
            self.core.worker_drain()
            self.pool.leave(self.connection_id)
            self.send(p.Ack("drain", ()))
            self._held_changed.set()
            self._close_if_drained()
            return
        try:
            self._tr_send.send_nowait(message)
        except trio.WouldBlock:
            # Refused as a whole: a negative ack per task (with the message id) so the
            # Worker can retry it; nothing was changed.
            self.send(
                p.Ack(
                    kind_of(message).value,
                    tuple(p.refused(t.task_id, "RESOURCE_EXHAUSTED") for t in message.tasks),
                    message.id,
                )
            )

    async def _accept_hello(self, hello: p.Hello) -> None:
        for index, queue_id in enumerate(hello.queues):
            if not self.principal.allows("workers:consume", queue_id):
                raise p.MessageRefused(
                    "PERMISSION_DENIED",
                    f"credential lacks workers:consume for queue {queue_id}",
                    field=f"queues[{index}]",
                    close_code=p.CLOSE_POLICY,
                )
            try:
                await self.queues.get_queue(self.principal.namespace_id, queue_id)
            except NotFound:
                raise p.MessageRefused(
                    "NOT_FOUND", f"queue {queue_id} not found", field=f"queues[{index}]", close_code=p.CLOSE_POLICY
                ) from None
            except OrbitError as exc:
                raise p.MessageRefused("UNAVAILABLE", exc.message, close_code=p.CLOSE_INTERNAL) from None
        attach = self.core.hello_received(hello, node_id=self.node_id, now=trio.current_time())
        await self.registry.register(self)
        config = self.config
        self.send(
            p.Welcome(
                connection_id=self.connection_id,
                node_id=self.node_id,
                heartbeat_interval_s=config.heartbeat_timeout_s / 3,
                heartbeat_timeout_s=config.heartbeat_timeout_s,
                max_message_bytes=config.max_ws_message_bytes,
                reservation_lease_s=config.reservation_lease_s,
                run_lease_s=config.run_lease_s,
            )
        )
        if attach is not None:
            # Answered by an ack of "attach" before anything sent after the hello.
            self._tr_send.send_nowait(attach)
        self.maybe_request_claim()

    def _close_if_drained(self) -> None:
        """A Worker that drained and holds nothing more is done: the node closes (1000)."""
        if self.core.worker_draining and self.core.drained and not self.core.node_draining:
            self.close_soon(p.CLOSE_NORMAL, "drained")

    # -- claims -----------------------------------------------------------------------

    def maybe_request_claim(self) -> None:
        """Hand the pool the claim request the core asks for, if any; or let a request
        that waits for its turn take the capacity freed since it was made."""
        request = self.core.next_claim()
        if request is not None:
            self._submit(request)
            return
        limit = self.core.claim_limit()
        if limit is not None:
            self.pool.widen(self.connection_id, limit)

    def _submit(self, request: ClaimRequest) -> None:
        try:
            self.pool.request(request, self._deliver)
        except SchedulerRefused:
            self.core.claim_failed(trio.current_time())
            self._wake_watchdog.set()
        except PoolClosed:
            self.core.claim_closed()

    def _deliver(self, result: Sequence[Reservation] | BaseException) -> None:
        self._held_changed.set()
        if isinstance(result, PoolClosed):
            self.core.claim_closed()
            return
        if isinstance(result, BaseException):
            self.core.claim_failed(trio.current_time())
            self._wake_watchdog.set()
            return
        self.core.claim_delivered(result, trio.current_time())
        if result:
            self.send(p.dispatch(result))
            self.observer.observe_dispatch(result)
            self._traces.dispatched(result)
        self.maybe_request_claim()

    # -- transitions --------------------------------------------------------------------

    async def _transitions(self) -> None:
        async for message in self._tr_recv:
            if message is RELEASE_UNSTARTED:
                await self._release_unstarted()
                continue
            try:
                await self._transition(message)
            except (p.MessageRefused, WorkerConnectionClosed):
                raise  # not the database's doing: the connection ends, as for any other error
            except OrbitError as exc:
                # The database could not be reached: every task of the message gets a
                # negative ack the Worker can retry; nothing changed ownership.
                self.send(
                    p.Ack(
                        kind_of(message).value, tuple(p.refused(t.task_id, exc.code) for t in message.tasks), message.id
                    )
                )
            self._held_changed.set()
            self._close_if_drained()
            self.maybe_request_claim()

    async def _release_unstarted(self) -> None:
        """Give back every reservation not started (the node drains): no ack, the Worker
        did not ask; a Start of one that arrives later is refused ``NOT_HELD``."""
        unstarted = [p.TaskRef(task_id, token) for task_id, token in self.core.unstarted()]
        if not unstarted:
            return
        try:
            outcomes = await self.transitions.release_many([(r.task_id, r.token) for r in unstarted])
        except OrbitError as exc:
            log.warning("connection %s: could not release %d reservations: %s", self.connection_id, len(unstarted), exc)
            return
        settled = self.core.settle(TransitionKind.RELEASE, unstarted, outcomes, trio.current_time())
        for back in settled.requeued:
            self.observer.tasks_requeued(self.principal.application_id, back.queue_id, back.due_at, back.due_in_s)
        self._held_changed.set()

    async def _transition(self, message: TransitionMessage) -> None:
        kind = kind_of(message)
        store = self.transitions
        split = self.core.split(kind, message.tasks)
        mine: Sequence[TaskHandle] = split.mine
        not_held: Sequence[str] = split.not_held
        # Answers for tasks this connection does not hold (a repeated Finish); by task id.
        recorded: dict[str, p.AckResult] = {}
        if isinstance(message, p.Finish):
            # The refs of a finish are its reports (``split`` keeps the type it is given).
            reports = cast(Sequence[p.FinishReport], mine)
            outcomes = await store.finish_many([finish_item(r) for r in reports]) if mine else []
            # A Finish of a task this connection does not hold is answered if it repeats
            # one recorded for that token (its ack was lost, on this connection or an
            # earlier one); nothing is written, and any other is NOT_HELD.
            unheld = set(not_held)
            elsewhere = [finish_item(r) for r in message.tasks if r.task_id in unheld]
            if elsewhere:
                ns = self.principal.namespace_id
                for answer in await store.finish_many(elsewhere, recorded_only=ns):
                    if answer.ok:
                        recorded[answer.task_id] = ack_result(answer)
        elif isinstance(message, p.Attach):
            ns, node, conn = self.principal.namespace_id, self.node_id, self.connection_id
            attach = [AttachItem(r.task_id, r.token, ns, node, conn) for r in split.mine]
            outcomes = await store.attach_many(attach) if attach else []
        else:
            run = {
                TransitionKind.START: store.start_many,
                TransitionKind.RENEW: store.renew_many,
                TransitionKind.RELEASE: store.release_many,
            }[kind]
            outcomes = await run([(r.task_id, r.token) for r in mine]) if mine else []
        settled = self.core.settle(kind, mine, outcomes, trio.current_time())
        if kind in (TransitionKind.START, TransitionKind.FINISH, TransitionKind.RELEASE):
            self._traces.transitioned(kind.value, outcomes, message.tasks)
            self._traces.keep_only(self.core.held)
        if kind in (TransitionKind.START, TransitionKind.ATTACH):
            # A task that now runs may have a deadline sooner than the watchdog's next look.
            self._wake_watchdog.set()
        results = [recorded.get(task_id) or p.refused(task_id, "NOT_HELD") for task_id in not_held]
        results += [p.refused(task_id, "WRONG_STATE") for task_id in split.wrong_state]
        results += [ack_result(outcome) for _, outcome in zip(mine, outcomes, strict=False)]
        for seconds in settled.started_after_s:
            self.observer.observe_started(seconds)
        for back in settled.requeued:
            self.observer.tasks_requeued(self.principal.application_id, back.queue_id, back.due_at, back.due_in_s)
        if kind is TransitionKind.FINISH:
            self.observer.observe_finish(outcomes)
        # A Finish ends its tasks; a Start or renew may settle one (its deadline passed,
        # cancelled before it ran).
        ended = [o.task_id for o in outcomes if o.state in TERMINAL_STATES and not o.duplicate]
        if ended:
            self.observer.tasks_finished(self.principal.application_id, ended)
        self.send(p.Ack(kind.value, tuple(results), message.id))
        if settled.cancels:
            self.send(p.cancel([(c.task_id, c.reason) for c in settled.cancels]))

    # -- timers -------------------------------------------------------------------------

    async def _watchdog(self) -> None:
        while True:
            now = trio.current_time()
            if self.core.silent(now):
                self.send(p.Error("HEARTBEAT_TIMEOUT", f"nothing received for {self.core.heartbeat_timeout_s:g} s"))
                self.close_soon(p.CLOSE_HEARTBEAT_TIMEOUT, "heartbeat timeout")
                return
            request = self.core.claim_retry(now)
            if request is not None:
                self._submit(request)
            passed = self.core.deadlines_passed(now)
            if passed:
                self.send(p.cancel([(task_id, "deadline") for task_id in passed]))
            self._wake_watchdog = trio.Event()
            with trio.move_on_at(self.core.watch_until()):
                await self._wake_watchdog.wait()

    async def _drain_watch(self) -> None:
        async with trio.open_nursery() as either:
            for event in (self.shutdown_requested, self._moved):
                either.start_soon(_then_cancel, event, either.cancel_scope)
        moved = not self.shutdown_requested.is_set()
        # No new requests from here on. At shutdown the pool's own shutdown answers a
        # pending one (PoolClosed) and lets an in-flight one deliver its reservations here;
        # a connection moved away withdraws its request as on the Worker's own drain (the
        # pool releases what an in-flight one reserves).
        self.core.node_drain()
        if moved:
            self.core.worker_drain()
            self.pool.leave(self.connection_id)
        self.send(p.drain("moved" if moved else "shutdown"))
        # Reservations not started go back to their queues at once (through the transition
        # loop, after any Start already received); running tasks keep their leases: the
        # Worker re-attaches them on its next connection, here or on another node, and
        # reports them there. The connection ends when the Worker closes it, or when it
        # holds nothing more (a Worker that finishes what runs instead), or after the
        # node's grace period.
        await self._tr_send.send(RELEASE_UNSTARTED)
        with trio.move_on_after(self.config.shutdown_grace_s):
            while not self.core.drained:
                self._held_changed = trio.Event()
                await self._held_changed.wait()
        if moved:
            self.close_soon(p.CLOSE_MOVED, MOVED_REASON)
        else:
            self.close_soon(p.CLOSE_GOING_AWAY, "node shutting down")


async def _then_cancel(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
