"""Values of the ownership protocol, shared by the claim, the transitions and recovery
(``orbit_node.store.leases`` runs them): what a claim hands out, what a transition is
asked and answers, what a recovery pass did.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any

import attrs

from .errors import FailedPrecondition

# States in which a task is owned by a connection (it holds a lease and a fencing token).
LIVE_STATES = ("reserved", "running")


class Outcome(enum.Enum):
    """What a transition did (or why it did nothing)."""

    STARTED = "started"
    RENEWED = "renewed"
    # A running task taken over by a new connection of its Worker (its token, lease valid).
    ATTACHED = "attached"
    RELEASED = "released"
    SUCCEEDED = "succeeded"
    # The attempt failed and the task is queued again (available_at moved by backoff).
    RETRY = "retry"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    OWNERSHIP_LOST = "ownership_lost"


class LostReason(enum.Enum):
    NOT_FOUND = "not_found"
    # The token is not the task's current one: an older (or forged) attempt.
    TOKEN_MISMATCH = "token_mismatch"
    # The token is current but the task is not in a state this transition applies to.
    WRONG_STATE = "wrong_state"
    # The lease ran out on the database clock (whether or not recovery has run yet).
    LEASE_EXPIRED = "lease_expired"


class OwnershipLost(FailedPrecondition):
    """The caller no longer owns the task: its token is stale or its lease expired."""

    code = "OWNERSHIP_LOST"

    def __init__(self, task_id: str, reason: LostReason):
        super().__init__(
            f"task {task_id}: ownership lost ({reason.value})",
            field="fencing_token",
            details={"task_id": task_id, "reason": reason.value},
        )
        self.task_id = task_id
        self.reason = reason


@attrs.frozen(kw_only=True)
class Reservation:
    """A task reserved for one connection. Times are naive UTC datetimes of the database clock."""

    task_id: str
    queue_id: str
    namespace_id: str
    application_id: str
    handler: str
    handler_version: str
    payload_version: str
    payload_json: str
    priority: int
    # The attempt number a Start of this reservation begins (attempts so far + 1).
    attempt: int
    max_attempts: int
    fencing_token: str
    lease_expires_at: datetime
    deadline: datetime | None
    resource_key: str | None
    available_at: datetime
    # Seconds from the claim (database clock) to the deadline; None without one. A node
    # times the deadline's notice to the Worker by it, on its own clock.
    deadline_in_s: float | None = None
    # The submission's W3C trace context in its stored form (``orbit_node.domain.trace_context``),
    # or None: sent with the dispatch so the Worker's span continues the producer's trace.
    trace_context: str | None = None
    # Its parents (depends_on, 000027), by id: sent with the dispatch so that the handler
    # can read their results.
    parents: tuple[str, ...] = ()


@attrs.frozen
class AttachItem:
    """A running task a Worker presents on a new connection: adopted by ``connection_id``
    of ``node_id`` if its token is current and its lease valid, and it is of ``namespace_id``."""

    task_id: str
    token: str
    namespace_id: str
    node_id: str
    connection_id: str


@attrs.frozen
class FinishItem:
    task_id: str
    token: str
    result_json: str | None = None
    # None means success; otherwise a JSON-serialisable object such as {"code", "message"}.
    error: dict[str, Any] | None = None
    retryable: bool = False

    def __attrs_post_init__(self) -> None:
        if self.error is not None and self.result_json is not None:
            raise ValueError("a finish carries a result or an error, not both")


def _applied(result: TransitionResult) -> bool:
    return result.outcome is not Outcome.OWNERSHIP_LOST


@attrs.frozen(kw_only=True)
class TransitionResult:
    task_id: str
    outcome: Outcome
    # The transition asked for took effect (or had already, for a duplicate). False when
    # ownership was lost, and for a Start or renew of a reservation that had been settled
    # as cancelled/expired (then ``outcome`` says which).
    ok: bool = attrs.field(default=attrs.Factory(_applied, takes_self=True))
    # The task's state after this transaction (None when the task does not exist).
    state: str | None = None
    # RENEWED / STARTED / ATTACHED: the new lease expiry (database clock).
    lease_expires_at: datetime | None = None
    # ATTACHED: the task's queue (the new connection did not receive its dispatch), and
    # the seconds from this transaction to its deadline (None: none).
    queue_id: str | None = None
    deadline_in_s: float | None = None
    # RETRY: when the task becomes due again, and how long after this transaction's
    # database clock that is (its backoff: a node sets its own timer by it).
    available_at: datetime | None = None
    backoff_s: float | None = None
    # STARTED / RENEWED / ATTACHED: the Worker should stop the handler (cancel requested, deadline passed).
    cancel_requested: bool = False
    deadline_passed: bool = False
    # The same transition was already applied for this token; nothing was written.
    duplicate: bool = False
    lost_reason: LostReason | None = None
    # The task held a resource key and this transition gave it up: a task of its queue
    # waiting for that key may be claimed now.
    freed_key: bool = False
    # SUCCEEDED: one entry per child its success released (the child's queue, its due time
    # or None for now, seconds until it): each may be claimed then.
    released: tuple[tuple[str, datetime | None, float | None], ...] = ()

    @property
    def code(self) -> str | None:
        """A stable machine code when the transition did not take effect."""
        if self.ok:
            return None
        return OwnershipLost.code if self.outcome is Outcome.OWNERSHIP_LOST else f"TASK_{self.outcome.name}"


@attrs.frozen
class RecoveryStats:
    # Expired reservations put back in the queue (no attempt used).
    requeued: int = 0
    # Expired run leases counted as failed attempts and queued again with backoff.
    retried: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0
    # A pass hit its batch limit: more work is probably waiting.
    saturated: bool = False

    @property
    def total(self) -> int:
        return self.requeued + self.retried + self.failed + self.cancelled + self.expired

    def __add__(self, other: RecoveryStats) -> RecoveryStats:
        return RecoveryStats(
            self.requeued + other.requeued,
            self.retried + other.retried,
            self.failed + other.failed,
            self.cancelled + other.cancelled,
            self.expired + other.expired,
            self.saturated or other.saturated,
        )


# Tests force interleavings through this: awaited at named points inside transactions
# ("claim.locked", "claim.reserved" (everything written, not yet committed), "start.locked",
# "finish.locked", "release.locked", "recover.locked") with the task ids involved.
Hook = Callable[[str, tuple[str, ...]], Awaitable[None]]

# What a transaction body awaits at those points: the store's hook as it is at that moment.
At = Callable[[str, Iterable[str]], Awaitable[None]]
