"""The bookkeeping of one Worker connection, sans-IO.

``ConnectionCore`` knows which tasks the connection holds and in which state,
whether a claim request is outstanding, and whether the Worker or the node is
draining. It decides, synchronously and without a clock of its own (the caller
passes ``now``):

* which task references of a ``start`` / ``renew`` / ``finish`` / ``release`` are
  this connection's to send to the lease store, and which are refused
  ``NOT_HELD`` (``split``);
* what the store's answer changes: a started reservation runs, a refused,
  finished or released task is dropped, a renewed one may carry a cancel notice
  (``settle``);
* when to ask for the next claim and for how many tasks (``next_claim``), what a
  delivery or a failed request changes (``claim_delivered``, ``claim_failed``,
  ``claim_closed``, ``claim_retry``);
* when a draining connection is done (``drained``);
* whether a frame for the Worker fits its send buffer, or the Worker reads too slowly
  and the connection closes (``frame``, ``frame_left``).

The four transitions are one table (``RULES``): the held states each accepts and
what an accepted or a refused result does. ``WorkerConnection`` is the trio adapter
around this object: it awaits the store, the claim pool and the WebSocket, and
sends the frames this object lets through.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

import attrs

from ..domain.claims import ClaimRequest
from ..domain.ownership import FinishItem, Outcome, TransitionResult
from ..domain.wire import rfc3339
from . import protocol as p
from .send_buffer import Frame, SendBuffer

if TYPE_CHECKING:
    from ..domain.ownership import Reservation


# Results that put the task back in its queue: a claim of that queue may take it again.
_REQUEUED = frozenset({Outcome.RELEASED, Outcome.RETRY})


class TaskState(enum.Enum):
    """Where a task this connection holds stands."""

    # Dispatched to the Worker, not started yet.
    RESERVED = "reserved"
    # The Worker's Start was accepted.
    RUNNING = "running"
    # Presented in the hello as running on the Worker's earlier connection; counted in the
    # capacity until the database says whether this connection may adopt it.
    ATTACHING = "attaching"


class TransitionKind(enum.Enum):
    """The Worker's four task transitions; the value is the ``ack``'s ``of``."""

    START = "start"
    RENEW = "renew"
    FINISH = "finish"
    RELEASE = "release"
    ATTACH = "attach"


class Effect(enum.Enum):
    """What one store result does to the task on this connection."""

    # The task stays held as it is.
    KEEP = "keep"
    # The reservation becomes a running task.
    RUN = "run"
    # A presented task becomes a running task of this connection (its queue from the store).
    ADOPT = "adopt"
    # The connection no longer holds the task.
    DROP = "drop"


@attrs.frozen
class TransitionRule:
    """One transition kind: which refs it sends to the store and what results do."""

    # Held states a ref must be in (with its token) to go to the store.
    accepts: frozenset[TaskState]
    # What an accepted (``ok``) result does.
    on_ok: Effect
    # What a refused result does (ownership lost, task cancelled/expired).
    on_refused: Effect
    # An accepted result may tell the Worker to stop the handler (cancel notice).
    notices: bool = False


RULES: Mapping[TransitionKind, TransitionRule] = MappingProxyType(
    {
        TransitionKind.START: TransitionRule(
            accepts=frozenset({TaskState.RESERVED}), on_ok=Effect.RUN, on_refused=Effect.DROP
        ),
        # A reservation is not renewed: it is started or released within its lease.
        TransitionKind.RENEW: TransitionRule(
            accepts=frozenset({TaskState.RUNNING}), on_ok=Effect.KEEP, on_refused=Effect.DROP, notices=True
        ),
        TransitionKind.FINISH: TransitionRule(
            accepts=frozenset({TaskState.RUNNING}), on_ok=Effect.DROP, on_refused=Effect.DROP
        ),
        TransitionKind.RELEASE: TransitionRule(
            accepts=frozenset({TaskState.RESERVED}), on_ok=Effect.DROP, on_refused=Effect.DROP
        ),
        TransitionKind.ATTACH: TransitionRule(
            accepts=frozenset({TaskState.ATTACHING}), on_ok=Effect.ADOPT, on_refused=Effect.DROP, notices=True
        ),
    }
)

TransitionMessage = p.Start | p.Renew | p.Finish | p.Release | p.Attach

_KIND_OF_MESSAGE: Mapping[type[TransitionMessage], TransitionKind] = MappingProxyType(
    {
        p.Start: TransitionKind.START,
        p.Renew: TransitionKind.RENEW,
        p.Finish: TransitionKind.FINISH,
        p.Release: TransitionKind.RELEASE,
        p.Attach: TransitionKind.ATTACH,
    }
)


def kind_of(message: TransitionMessage) -> TransitionKind:
    """The transition kind of a parsed ``start`` / ``renew`` / ``finish`` / ``release``."""
    return _KIND_OF_MESSAGE[type(message)]


class TaskHandle(Protocol):
    """What a Worker names a task by: ``protocol.TaskRef`` and ``protocol.FinishReport``."""

    @property
    def task_id(self) -> str: ...

    @property
    def token(self) -> str: ...


Ref = TypeVar("Ref", bound=TaskHandle)

CancelReason = Literal["cancel_requested", "deadline"]


@attrs.frozen
class Held:
    """A task this connection holds."""

    token: str
    state: TaskState
    queue_id: str
    # The caller's clock when the task was dispatched (metrics: dispatch -> Start).
    dispatched_at: float
    # The caller's clock when its deadline passes; None without one.
    deadline_at: float | None = None

    def running(self) -> Held:
        """The same task, started (built directly: ``attrs.evolve`` costs three times as
        much, once per task a Start settles)."""
        return Held(self.token, TaskState.RUNNING, self.queue_id, self.dispatched_at, self.deadline_at)


@attrs.frozen
class Split(Generic[Ref]):
    """A transition's refs: the ones for the store, the ones refused ``NOT_HELD`` (not
    held by this connection with that token) and the ones refused ``WRONG_STATE`` (held,
    but in a state the transition does not apply to: a Finish before its Start, a renew of
    a reservation)."""

    mine: tuple[Ref, ...]
    not_held: tuple[str, ...]
    wrong_state: tuple[str, ...] = ()


@attrs.frozen
class CancelNotice:
    """The Worker should stop the handler of ``task_id``."""

    task_id: str
    reason: CancelReason


# Protocol errors a connection may make before the node closes it (each is answered
# with an ``error`` frame; the one after this many closes with CLOSE_PROTOCOL).
MAX_PROTOCOL_ERRORS = 16


@attrs.frozen
class Close:
    """Close the connection with ``code`` and ``reason``."""

    code: int
    reason: str


@attrs.frozen
class Requeued:
    """Tasks went back to ``queue_id``, due at ``due_at`` (database clock; None: now),
    ``due_in_s`` after the transaction that put them back."""

    queue_id: str
    due_at: datetime | None = None
    due_in_s: float | None = None


@attrs.frozen
class Settled:
    """What the store's results changed on this connection."""

    # Seconds from dispatch to the accepted Start, one per task started.
    started_after_s: tuple[float, ...] = ()
    # Cancel notices for the Worker, in the order of the refs.
    cancels: tuple[CancelNotice, ...] = ()
    # Task ids the connection no longer holds.
    dropped: tuple[str, ...] = ()
    # Queues a task went back to (released: due now; a retry: due after its backoff), each
    # due time once: their waiting claims may find it then.
    requeued: tuple[Requeued, ...] = ()


@attrs.define(eq=False)
class ConnectionCore:
    """The held / outstanding / draining state of one Worker connection, and what the
    protocol decides about it: the order of its first messages, its budget of protocol
    errors, when its silence ends it, how much it may leave unread."""

    connection_id: str
    application_id: str
    namespace_id: str
    # The most tasks one claim asks for (``NodeConfig.claim_batch_size``).
    claim_batch_size: int
    # How long after a refused or failed claim request to ask again (the scan cycle).
    retry_after_s: float
    # A connection silent this long is gone (``NodeConfig.heartbeat_timeout_s``).
    heartbeat_timeout_s: float = 30.0
    # The frames queued for the writer, within the node's send buffer bounds.
    send_buffer: SendBuffer = attrs.field(kw_only=True)
    # The caller's clock when the latest frame arrived (``received``).
    last_received: float = attrs.field(default=0.0, init=False)
    protocol_errors: int = attrs.field(default=0, init=False)
    hello: p.Hello | None = attrs.field(default=None, init=False)
    # The connection has a claim request in the pool (pending or running).
    outstanding: bool = attrs.field(default=False, init=False)
    worker_draining: bool = attrs.field(default=False, init=False)
    node_draining: bool = attrs.field(default=False, init=False)
    # How the connection closes, once the node chose (the first choice stands): no new
    # claims, no new frames.
    closing: Close | None = attrs.field(default=None, init=False)
    # When to ask again after a refused or failed claim request (caller's clock).
    retry_claim_at: float | None = attrs.field(default=None, init=False)
    _held: dict[str, Held] = attrs.field(factory=dict, init=False)
    # Running tasks the Worker was told had passed their deadline (told once).
    _deadline_told: set[str] = attrs.field(factory=set, init=False)
    # The claim request of this connection with ``limit=0``; set by ``hello_received``.
    _claim: ClaimRequest | None = attrs.field(default=None, init=False)

    # -- the protocol's rules -----------------------------------------------------------

    def received(self, now: float) -> None:
        """A frame arrived at ``now``: the silence clock starts again."""
        self.last_received = now

    def silent(self, now: float) -> bool:
        """Nothing arrived for ``heartbeat_timeout_s``: the Worker is gone."""
        return now - self.last_received >= self.heartbeat_timeout_s

    def watch_until(self) -> float:
        """When the watchdog must look again without an event: the silence deadline, the
        retry of a refused claim request, or the first deadline of a running task, whichever
        is soonest."""
        deadline = self.last_received + self.heartbeat_timeout_s
        if self.retry_claim_at is not None:
            deadline = min(deadline, self.retry_claim_at)
        for task_id, held in self._held.items():
            if held.deadline_at is not None and held.state is TaskState.RUNNING and task_id not in self._deadline_told:
                deadline = min(deadline, held.deadline_at)
        return deadline

    def deadlines_passed(self, now: float) -> list[str]:
        """Running tasks whose deadline passed by ``now`` and whose Worker has not been
        told: each is told once (a ``cancel`` with reason ``deadline``)."""
        passed = [
            task_id
            for task_id, held in self._held.items()
            if held.state is TaskState.RUNNING
            and held.deadline_at is not None
            and held.deadline_at <= now
            and task_id not in self._deadline_told
        ]
        self._deadline_told.update(passed)
        return passed

    def check_order(self, message: p.Message) -> None:
        """``hello`` first (anything else closes the connection), and only once; a
        heartbeat goes at any time."""
        if isinstance(message, p.Heartbeat):
            return
        if self.hello is None and not isinstance(message, p.Hello):
            raise p.MessageRefused(
                "OUT_OF_ORDER", "the first message must be hello", field="type", close_code=p.CLOSE_PROTOCOL
            )
        if self.hello is not None and isinstance(message, p.Hello):
            raise p.MessageRefused("OUT_OF_ORDER", "hello was already received", field="type")

    def refused(self, refusal: p.MessageRefused) -> Close | None:
        """A message was refused (the Worker is told with an ``error`` frame): whether the
        connection closes now, because the refusal says so or the Worker has spent its
        budget of ``MAX_PROTOCOL_ERRORS``."""
        self.protocol_errors += 1
        if refusal.close_code is not None:
            return Close(refusal.close_code, refusal.code)
        if self.protocol_errors > MAX_PROTOCOL_ERRORS:
            return Close(p.CLOSE_PROTOCOL, "too many protocol errors")
        return None

    def frame(self, message: p.NodeMessage | dict[str, Any]) -> Frame | Close | None:
        """The frame to queue for the writer for ``message``, counted in the send buffer.

        None once the connection is closing: nothing more is queued. A ``Close`` when the
        frame does not fit the send buffer: the Worker reads too slowly, the connection
        closes as a slow consumer and the frames it left unread are dropped (``frame_left``)."""
        if self.closing is not None:
            return None
        frame = Frame.of(message)
        if not self.send_buffer.fits(frame):
            return Close(p.CLOSE_SLOW_CONSUMER, "slow consumer")
        self.send_buffer.add(frame)
        return frame

    def frame_left(self, frame: Frame) -> None:
        """A queued frame left the send buffer: the writer took it, or it was dropped."""
        self.send_buffer.remove(frame)

    # -- connection life ---------------------------------------------------------------

    def hello_received(self, hello: p.Hello, *, node_id: str, now: float = 0.0) -> p.Attach | None:
        """The Worker's accepted hello: its queues, capabilities and capacity. The running
        tasks it presents are held as ``ATTACHING`` (counted in its capacity) until the
        returned ``Attach`` is settled."""
        self.hello = hello
        for ref in hello.tasks:
            self._held[ref.task_id] = Held(ref.token, TaskState.ATTACHING, "", now)
        self._claim = ClaimRequest(
            connection_id=self.connection_id,
            node_id=node_id,
            application_id=self.application_id,
            namespace_id=self.namespace_id,
            queue_ids=hello.queues,
            capabilities=hello.capabilities,
            resource_key_support=hello.resource_keys,
            limit=0,
        )
        return p.Attach(hello.tasks) if hello.tasks else None

    def worker_drain(self) -> None:
        """The Worker said ``drain``: no new claims; its pending request is withdrawn."""
        self.worker_draining = True
        self.outstanding = False

    def node_drain(self) -> None:
        """The node is shutting down: no new claims; an in-flight one still delivers."""
        self.node_draining = True

    def start_closing(self, code: int = p.CLOSE_NORMAL, reason: str = "") -> bool:
        """The connection closes with ``code``: no new claims, no new frames. False when it
        was closing already (the first close stands)."""
        if self.closing is not None:
            return False
        self.closing = Close(code, reason)
        return True

    @property
    def held(self) -> Mapping[str, Held]:
        """The tasks this connection holds, by task id (read only)."""
        return MappingProxyType(self._held)

    @property
    def drained(self) -> bool:
        """Nothing held and no claim outstanding: a draining connection may close."""
        return not self._held and not self.outstanding

    def unstarted(self) -> list[tuple[str, str]]:
        """(task_id, token) of every reservation not started: released when the connection ends."""
        return [(task_id, h.token) for task_id, h in self._held.items() if h.state is TaskState.RESERVED]

    # -- claims ------------------------------------------------------------------------

    @property
    def free_capacity(self) -> int:
        return 0 if self.hello is None else self.hello.capacity - len(self._held)

    @property
    def claim_threshold(self) -> int:
        """Free slots worth a claim while the connection holds tasks: half of what one
        claim can take (``min(capacity, claim_batch_size)``), at least one."""
        if self.hello is None:
            return 1
        return max(1, -(-min(self.hello.capacity, self.claim_batch_size) // 2))

    def _may_claim(self) -> bool:
        return not (self._claim is None or self.worker_draining or self.node_draining or self.closing is not None)

    def next_claim(self) -> ClaimRequest | None:
        """The claim request to submit now, or None; a returned request is outstanding.

        A request is made after hello, when none is outstanding, neither the Worker nor
        the node drains and the connection is not closing, and either it holds nothing
        (an idle Worker asks at once) or a worthwhile share of it is free
        (``claim_threshold``); it asks for the free capacity, at most ``claim_batch_size``.
        """
        free = self.free_capacity
        claim = self._claim
        if claim is None or not self._may_claim() or self.outstanding or free <= 0:
            return None
        if self._held and free < self.claim_threshold:
            return None
        self.outstanding = True
        return attrs.evolve(claim, limit=min(free, self.claim_batch_size))

    def claim_limit(self) -> int | None:
        """With a request outstanding, the limit it may have now (capacity freed since it
        was made); the pool raises a request that still waits for its turn to this."""
        if not self.outstanding or not self._may_claim() or self.free_capacity <= 0:
            return None
        return min(self.free_capacity, self.claim_batch_size)

    def claim_delivered(self, reservations: Sequence[Reservation], now: float) -> None:
        """The claim ran: its reservations are held, reserved, dispatched at ``now``."""
        self.outstanding = False
        for r in reservations:
            deadline_at = None if r.deadline_in_s is None else now + r.deadline_in_s
            self._held[r.task_id] = Held(r.fencing_token, TaskState.RESERVED, r.queue_id, now, deadline_at)

    def claim_failed(self, now: float) -> None:
        """The scheduler refused the request or the claim failed: ask again a scan cycle later."""
        self.outstanding = False
        self.retry_claim_at = now + self.retry_after_s

    def claim_closed(self) -> None:
        """The claim pool is closed (node shutdown): no retry."""
        self.outstanding = False

    def claim_retry(self, now: float) -> ClaimRequest | None:
        """At or after ``retry_claim_at``: clear it and return ``next_claim()``; else None."""
        if self.retry_claim_at is None or now < self.retry_claim_at:
            return None
        self.retry_claim_at = None
        return self.next_claim()

    # -- transitions -------------------------------------------------------------------

    def split(self, kind: TransitionKind, refs: Sequence[Ref]) -> Split[Ref]:
        """The refs this connection holds, with their token, in a state ``kind`` accepts."""
        accepts = RULES[kind].accepts
        mine: list[Ref] = []
        not_held: list[str] = []
        wrong_state: list[str] = []
        for ref in refs:
            held = self._held.get(ref.task_id)
            if held is None or held.token != ref.token:
                not_held.append(ref.task_id)
            elif held.state in accepts:
                mine.append(ref)
            else:
                wrong_state.append(ref.task_id)
        return Split(tuple(mine), tuple(not_held), tuple(wrong_state))

    def settle(
        self, kind: TransitionKind, refs: Sequence[TaskHandle], results: Sequence[TransitionResult], now: float
    ) -> Settled:
        """Apply the store's results (in the order of ``refs``, the ``mine`` of ``split``)."""
        rule = RULES[kind]
        started: list[float] = []
        cancels: list[CancelNotice] = []
        dropped: list[str] = []
        requeued: dict[Requeued, None] = {}
        for ref, result in zip(refs, results, strict=False):  # fewer results than refs: the rest stay held
            effect = rule.on_ok if result.ok else rule.on_refused
            if effect is Effect.DROP:
                gone = self._held.pop(ref.task_id, None)
                self._deadline_told.discard(ref.task_id)
                if gone is not None:
                    dropped.append(ref.task_id)
                    if result.ok and result.outcome in _REQUEUED:
                        requeued[Requeued(gone.queue_id, result.available_at, result.backoff_s)] = None
                    if result.ok and result.freed_key:
                        # Its resource key is free: a task of its queue waiting for the key may go now.
                        requeued[Requeued(gone.queue_id)] = None
                    for queue_id, due_at, due_in_s in result.released if result.ok else ():
                        # Children it released (their last parent succeeded) are due.
                        requeued[Requeued(queue_id, due_at, due_in_s)] = None
            elif effect is Effect.RUN:
                held = self._held.get(ref.task_id)
                if held is not None:
                    self._held[ref.task_id] = held.running()
                    started.append(now - held.dispatched_at)
            elif effect is Effect.ADOPT:
                held = self._held.get(ref.task_id)
                if held is not None:
                    deadline_at = None if result.deadline_in_s is None else now + result.deadline_in_s
                    self._held[ref.task_id] = Held(
                        held.token, TaskState.RUNNING, result.queue_id or "", now, deadline_at
                    )
            if result.ok and rule.notices:
                if result.cancel_requested:
                    cancels.append(CancelNotice(ref.task_id, "cancel_requested"))
                elif result.deadline_passed:
                    cancels.append(CancelNotice(ref.task_id, "deadline"))
        return Settled(tuple(started), tuple(cancels), tuple(dropped), tuple(requeued))


# -- translation between the protocol and the lease store -------------------------------


def finish_item(report: p.FinishReport) -> FinishItem:
    """What the store settles for one reported Finish."""
    return FinishItem(
        task_id=report.task_id,
        token=report.token,
        result_json=report.result_json,
        error=dict(report.error) if report.error is not None else None,
        retryable=report.retryable,
    )


_LEASED = frozenset({Outcome.STARTED, Outcome.RENEWED, Outcome.ATTACHED})


def ack_result(result: TransitionResult) -> p.AckResult:
    """One ``ack`` result for a store transition result."""
    if not result.ok:
        return p.AckResult(result.task_id, False, result.code, result.state)
    return p.AckResult(
        result.task_id,
        True,
        None,
        result.state,
        rfc3339(result.lease_expires_at),
        bool(result.cancel_requested or result.deadline_passed) if result.outcome in _LEASED else None,
    )
