"""The dispatch core in the database: claims, leases with fencing, retries, recovery.

MySQL transactions decide who may run what; this repository is the only code that
runs their SQL (``db/sql/dispatch.sql``). See ``docs/dispatch.md`` for the design.

* Every time that decides ownership comes from the database clock (``NOW(6)``); a
  node's clock is never consulted, so nodes with skewed clocks stay correct.
* A claim first reads candidates without locking, in dispatch order, then locks
  exactly the rows it will take by primary key with ``SKIP LOCKED``: it never locks a
  task it does not reserve or settle (a ``SKIP LOCKED`` scan would keep locks on every
  row it read and filtered out, hiding them from Workers that could run them).
* Every later transition is a compare-and-set on (task, fencing token, state, lease
  still valid on the database clock). Losing it is a typed outcome
  (``Outcome.OWNERSHIP_LOST``) in the batch forms and ``OwnershipLost`` in the
  single-item forms, never a crash.
* Transaction bodies are replayed by ``Database.transaction`` on deadlock and lock-wait
  errors, so they only touch the database through ``tx`` and rebuild all state per run.
"""

from __future__ import annotations

import calendar
import enum
import json
import random
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import attrs

from ..db import Database, Tx
from .backoff import backoff_delay_ms
from ..errors import DatabaseError, FailedPrecondition, NotFound
from ..claims import Capability, ClaimRequest
from ..ids import is_hex32
from ..wire import rfc3339

LIVE_STATES = ("reserved", "running")
# A claim re-reads candidates of a queue at most this often when rows it picked were
# taken by concurrent claims or settled: enough to fill a batch under contention, while
# the transaction stays short.
MAX_CLAIM_ROUNDS = 4
# Once concurrent claims won some of the rows a claim picked, its next rounds read this
# many times further ahead and pick at random there, so contending claims stop chasing the
# same rows in lockstep. An uncontended claim always takes exactly the head, in order.
CONTENDED_LOOKAHEAD = 4
# Default rows per recovery transaction: a sweep pass stays a few milliseconds long.
RECOVERY_BATCH = 256
# The tasks.error column is TEXT (64 KiB). Larger error objects are cut down to their
# code and the start of their message.
MAX_ERROR_BYTES = 16 * 1024
MAX_ERROR_MESSAGE_CHARS = 4096
# Explanations treat a registered Worker connection as gone when its node missed three
# registry heartbeats (every 10 s) or stopped.
WORKER_STALE_S = 30
# Explanations count the tasks ahead of a task up to this many (an explanation of a task
# deep in a huge backlog stays cheap; the answer then says "at least").
POSITION_CAP = 10_000
# Attempt outcomes written by Finish (the attempt had started). A Finish repeated with
# the same token is answered from these and writes nothing.
FINISH_OUTCOMES = frozenset({"succeeded", "retry", "failed", "cancelled", "expired"})


class Outcome(enum.Enum):
    """What a transition did (or why it did nothing)."""

    STARTED = "started"
    RENEWED = "renewed"
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


@attrs.frozen
class FinishItem:
    task_id: str
    token: str
    result_json: str | None = None
    # None means success; otherwise a JSON-serialisable object such as {"code", "message"}.
    error: dict[str, Any] | None = None
    retryable: bool = False

    def __attrs_post_init__(self):
        if self.error is not None and self.result_json is not None:
            raise ValueError("a finish carries a result or an error, not both")


def _applied(result: "TransitionResult") -> bool:
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
    # RENEWED / STARTED: the new lease expiry (database clock).
    lease_expires_at: datetime | None = None
    # RETRY: when the task becomes due again.
    available_at: datetime | None = None
    # STARTED / RENEWED: the Worker should stop the handler (cancel requested, deadline passed).
    cancel_requested: bool = False
    deadline_passed: bool = False
    # The same transition was already applied for this token; nothing was written.
    duplicate: bool = False
    lost_reason: LostReason | None = None

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

    def __add__(self, other: "RecoveryStats") -> "RecoveryStats":
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


# -- small helpers -------------------------------------------------------------------------


def _hex(text: str | None) -> str | None:
    return None if text is None else text.encode("utf-8").hex()


def error_json(error: Mapping[str, Any]) -> str:
    """The stored text of an error object, cut down to fit the column if needed."""
    text = json.dumps(error, ensure_ascii=False, separators=(",", ":"), default=str)
    if len(text.encode("utf-8")) <= MAX_ERROR_BYTES:
        return text
    message = str(error.get("message", ""))[:MAX_ERROR_MESSAGE_CHARS]
    return json.dumps(
        {"code": str(error.get("code", "ERROR"))[:128], "message": message, "truncated": True},
        ensure_ascii=False,
        separators=(",", ":"),
    )


def _reason(code: str, message: str) -> str:
    return error_json({"code": code, "message": message})


DEADLINE_ERROR = _reason("DEADLINE_EXCEEDED", "the deadline passed before the task could start")
ATTEMPTS_ERROR = _reason("ATTEMPTS_EXHAUSTED", "the task has no attempts left")
CANCELLED_ERROR = _reason("CANCELLED", "cancellation was requested")
LEASE_ERROR = _reason("LEASE_EXPIRED", "the run lease expired without renewal or finish")


def epoch_second(moment: datetime) -> int:
    """The database-clock second of a naive UTC datetime (same as UNIX_TIMESTAMP())."""
    return calendar.timegm(moment.utctimetuple())


@attrs.frozen
class _Budget:
    """How many more reservations one quota row allows in this claim."""

    remaining: int
    # The start-rate window this claim counts in (None: no start-rate control).
    window_s: int | None = None
    window_used: int = 0


UNLIMITED = _Budget(remaining=1 << 30)


def quota_budget(
    *,
    max_concurrent: int | None,
    live: int,
    max_per_second: int | None,
    window_s: int,
    window_count: int,
    now_s: int,
) -> _Budget:
    """Concurrency cap and fixed-window start rate of one application or queue row.

    A stored window at or after ``now_s`` is the current one (a claim that waited for
    the row lock may have read the clock before the holder wrote a later second), so the
    rule never grants more than ``max_per_second`` reservations per window second.
    """
    remaining = UNLIMITED.remaining
    if max_concurrent is not None:
        remaining = max(0, max_concurrent - live)
    if max_per_second is None:
        return _Budget(remaining)
    if window_s >= now_s:
        window, used = window_s, window_count
    else:
        window, used = now_s, 0
    return _Budget(min(remaining, max(0, max_per_second - used)), window, used)


def window_after(budget: _Budget, reserved: int, reserved_s: int) -> tuple[int, int]:
    """The (window second, count) to store after ``reserved`` reservations at ``reserved_s``."""
    assert budget.window_s is not None
    if reserved_s <= budget.window_s:
        return budget.window_s, budget.window_used + reserved
    return reserved_s, reserved


@attrs.frozen
class _Row:
    """A task row locked by a transition or by the sweeper."""

    task_id: str
    namespace_id: str
    state: str
    fencing_token: str | None
    cancel_requested: bool
    resource_key: str | None
    attempts: int
    max_attempts: int
    backoff_initial_ms: int
    backoff_max_ms: int
    backoff_multiplier: float
    deadline: datetime | None
    lease_expires_at: datetime | None
    lease_valid: bool
    past_deadline: bool
    now: datetime

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "_Row":
        return cls(
            task_id=row["task_id"],
            namespace_id=row["namespace_id"],
            state=row["state"],
            fencing_token=row["fencing_token"],
            cancel_requested=bool(row["cancel_requested"]),
            resource_key=row["resource_key"],
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            backoff_initial_ms=row["backoff_initial_ms"],
            backoff_max_ms=row["backoff_max_ms"],
            backoff_multiplier=float(row["backoff_multiplier"]),
            deadline=row["deadline"],
            lease_expires_at=row["lease_expires_at"],
            lease_valid=bool(row["lease_valid"]),
            past_deadline=bool(row["past_deadline"]),
            now=row["now"],
        )


# Keys of the per-task objects in the ``values`` JSON of the settle statements
# (``settle_attempts``, ``settle_terminal``, ``settle_requeue`` in db/sql/dispatch.sql,
# which read them as ``$."<task id>".<key>``). One letter each: a batch sends an object
# per task in one statement parameter. Result and error texts travel as hex.
OUTCOME_KEY = "o"  # task_attempts.outcome of the closed attempt
ERROR_KEY = "e"  # the error JSON text, hex
STATE_KEY = "s"  # the terminal state
RESULT_KEY = "r"  # the result JSON text, hex
AVAILABLE_AT_KEY = "a"  # the next available_at as DATETIME(6) text; absent keeps it


@attrs.define(eq=False)
class _Writes:
    """The writes one transaction decided, applied as a handful of batch statements."""

    # reserved -> running: task id -> token, with the run lease and the lock statement's NOW(6).
    started: dict[str, str] = attrs.field(factory=dict)
    start_now: datetime | None = None
    start_lease: datetime | None = None
    renewals: dict[datetime, list[str]] = attrs.field(factory=dict)
    attempts: dict[str, dict[str, str]] = attrs.field(factory=dict)
    attempt_pairs: list[tuple[str, str]] = attrs.field(factory=list)
    terminal: dict[str, dict[str, str]] = attrs.field(factory=dict)
    requeue: dict[str, dict[str, str]] = attrs.field(factory=dict)
    keys: dict[str, tuple[str, str]] = attrs.field(factory=dict)

    def start(self, row: _Row, token: str, lease: datetime) -> None:
        self.started[row.task_id] = token
        self.start_now, self.start_lease = row.now, lease

    def renew(self, row: _Row, lease: datetime) -> None:
        self.renewals.setdefault(lease, []).append(row.task_id)

    def close_attempt(self, row: _Row, outcome: str, error: str | None = None) -> None:
        """Record the outcome of the row's current attempt (the one its token names)."""
        if row.fencing_token is None:
            return
        values = {OUTCOME_KEY: outcome}
        if error is not None:
            values[ERROR_KEY] = _hex(error)
        self.attempts[row.task_id] = values
        self.attempt_pairs.append((row.task_id, row.fencing_token))

    def settle(self, row: _Row, state: str, *, result: str | None = None, error: str | None = None) -> None:
        values = {STATE_KEY: state}
        if result is not None:
            values[RESULT_KEY] = _hex(result)
        if error is not None:
            values[ERROR_KEY] = _hex(error)
        self.terminal[row.task_id] = values
        self._release_key(row)

    def back_to_queue(self, row: _Row, *, available_at: datetime | None = None, error: str | None = None) -> None:
        values = {}
        if available_at is not None:
            values[AVAILABLE_AT_KEY] = available_at.isoformat(sep=" ", timespec="microseconds")
        if error is not None:
            values[ERROR_KEY] = _hex(error)
        self.requeue[row.task_id] = values
        self._release_key(row)

    def _release_key(self, row: _Row) -> None:
        if row.resource_key is not None:
            self.keys[row.task_id] = (row.namespace_id, row.resource_key)

    async def apply(self, tx: Tx) -> None:
        if self.started:
            params = {"task_ids": tuple(self.started), "now": self.start_now, "lease_expires_at": self.start_lease}
            await tx.execute("start_tasks", params)
            await tx.execute("start_attempts", {**params, "pairs": tuple(self.started.items())})
        for lease, task_ids in self.renewals.items():
            await tx.execute("renew_tasks", {"task_ids": tuple(task_ids), "lease_expires_at": lease})
        if self.attempts:
            await tx.execute(
                "settle_attempts",
                {
                    "values": json.dumps(self.attempts),
                    "task_ids": tuple(self.attempts),
                    "pairs": tuple(self.attempt_pairs),
                },
            )
        if self.keys:
            await tx.execute(
                "settle_release_keys",
                {"keys": tuple(sorted(set(self.keys.values()))), "task_ids": tuple(self.keys)},
            )
        if self.terminal:
            await tx.execute("settle_terminal", {"values": json.dumps(self.terminal), "task_ids": tuple(self.terminal)})
        if self.requeue:
            await tx.execute("settle_requeue", {"values": json.dumps(self.requeue), "task_ids": tuple(self.requeue)})


def _lost(task_id: str, reason: LostReason) -> TransitionResult:
    return TransitionResult(task_id=task_id, outcome=Outcome.OWNERSHIP_LOST, lost_reason=reason)


def _not_owned(row: _Row, token: str, states: Sequence[str], *, settled_ok: bool) -> TransitionResult | None:
    """The refusal for a token that is not current or a state the transition does not apply to.

    A reservation that Start, release or the sweeper settled as cancelled/expired is
    answered with that outcome when it is named by its own token (``ok`` is
    ``settled_ok``: true for a release, which wanted it gone anyway)."""
    if row.fencing_token != token:
        return _lost(row.task_id, LostReason.TOKEN_MISMATCH)
    if row.state in states:
        return None
    if row.state in ("cancelled", "expired"):
        return TransitionResult(task_id=row.task_id, outcome=Outcome(row.state), ok=settled_ok, duplicate=True)
    return _lost(row.task_id, LostReason.WRONG_STATE)


# The task state each fresh outcome leaves behind.
_STATE_AFTER = {
    Outcome.STARTED: "running",
    Outcome.RELEASED: "queued",
    Outcome.RETRY: "queued",
    Outcome.SUCCEEDED: "succeeded",
    Outcome.FAILED: "failed",
    Outcome.CANCELLED: "cancelled",
    Outcome.EXPIRED: "expired",
}


def _with_state(result: TransitionResult, row: _Row) -> TransitionResult:
    if result.duplicate or result.outcome not in _STATE_AFTER:
        return attrs.evolve(result, state=row.state)
    return attrs.evolve(result, state=_STATE_AFTER[result.outcome])


def _pair(item: tuple[str, str]) -> tuple[str, str]:
    task_id, token = item
    return (str(task_id), str(token))


def _finish_key(item: FinishItem) -> tuple[str, str]:
    return (item.task_id, item.token)


T = TypeVar("T")
# decide(row, item, writes, context) -> result; context comes from the optional prepare step.
Decide = Callable[[_Row, T, _Writes, Any], TransitionResult]
Prepare = Callable[[Tx, Mapping[str, _Row], Sequence[tuple[str, str]]], Awaitable[Any]]


# -- the repository ------------------------------------------------------------------------


@attrs.define(eq=False)
class DispatchStore:
    db: Database
    reservation_lease_s: float = attrs.field(kw_only=True)
    run_lease_s: float = attrs.field(kw_only=True)
    batch_size: int = attrs.field(kw_only=True)
    hook: Hook | None = attrs.field(default=None, kw_only=True)
    rng: random.Random = attrs.field(factory=random.Random, kw_only=True)

    def __attrs_post_init__(self):
        if self.reservation_lease_s <= 0 or self.run_lease_s <= 0:
            raise ValueError("leases must be positive")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")

    @classmethod
    def from_config(cls, db: Database, config: Any) -> "DispatchStore":
        """Build from a ``NodeConfig`` (leases and claim batch size)."""
        return cls(
            db,
            reservation_lease_s=config.reservation_lease_s,
            run_lease_s=config.run_lease_s,
            batch_size=config.claim_batch_size,
        )

    async def _at(self, point: str, task_ids: Iterable[str]) -> None:
        if self.hook is not None:
            await self.hook(point, tuple(task_ids))

    # -- claim -------------------------------------------------------------------------

    async def claim(self, req: ClaimRequest) -> list[Reservation]:
        """Reserve up to ``min(req.limit, batch_size)`` due tasks in one short transaction."""
        limit = min(req.limit, self.batch_size)
        queue_ids = tuple(dict.fromkeys(q for q in req.queue_ids if is_hex32(q)))
        capabilities = tuple(sorted(c.as_tuple() for c in req.capabilities))
        if limit <= 0 or not queue_ids or not capabilities:
            return []

        async def body(tx: Tx) -> list[Reservation]:
            return await _Claim(self, tx, req, queue_ids, capabilities, limit).run()

        return await self.db.transaction(body)

    # -- transitions -------------------------------------------------------------------

    async def _transition(
        self,
        point: str,
        items: Sequence[T],
        key: Callable[[T], tuple[str, str]],
        decide: Decide,
        prepare: Prepare | None = None,
    ) -> list[TransitionResult]:
        """Lock the named tasks, decide each item (a compare-and-set on token, state and
        lease), then write all decisions with a few batch statements; one transaction."""
        if not items:
            return []
        keys = [key(item) for item in items]

        async def body(tx: Tx) -> list[TransitionResult]:
            task_ids = tuple(sorted({task_id for task_id, _ in keys}))
            rows = {r["task_id"]: _Row.from_row(r) for r in await tx.fetchall("transition_lock", {"task_ids": task_ids})}
            await self._at(point, task_ids)
            context = None if prepare is None else await prepare(tx, rows, keys)
            writes = _Writes()
            first: dict[tuple[str, str], TransitionResult] = {}
            results = []
            for item, item_key in zip(items, keys):
                if item_key in first:
                    # The same (task, token) twice in one batch: applied once.
                    results.append(attrs.evolve(first[item_key], duplicate=True))
                    continue
                row = rows.get(item_key[0])
                if row is None:
                    result = _lost(item_key[0], LostReason.NOT_FOUND)
                else:
                    result = _with_state(decide(row, item, writes, context), row)
                first[item_key] = result
                results.append(result)
            await writes.apply(tx)
            return results

        return await self.db.transaction(body)

    async def start_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        """reserved -> running for each (task_id, token) with a run lease; one transaction."""
        return await self._transition("start.locked", list(items), _pair, self._decide_start)

    def _decide_start(self, row: _Row, item: tuple[str, str], writes: _Writes, _: Any) -> TransitionResult:
        refused = _not_owned(row, item[1], LIVE_STATES, settled_ok=False)
        if refused is not None:
            return refused
        if not row.lease_valid:
            return _lost(row.task_id, LostReason.LEASE_EXPIRED)
        if row.state == "running":
            # Start repeated for the attempt that is running: answered, nothing written.
            return TransitionResult(
                task_id=row.task_id, outcome=Outcome.STARTED, duplicate=True, lease_expires_at=row.lease_expires_at,
                cancel_requested=row.cancel_requested, deadline_passed=row.past_deadline,
            )
        if row.past_deadline or row.cancel_requested:
            # A task past its deadline is never started; a cancelled one neither.
            state, error = ("expired", DEADLINE_ERROR) if row.past_deadline else ("cancelled", CANCELLED_ERROR)
            writes.close_attempt(row, state, error)
            writes.settle(row, state, error=error)
            return TransitionResult(task_id=row.task_id, outcome=Outcome(state), ok=False)
        lease = row.now + timedelta(seconds=self.run_lease_s)
        writes.start(row, item[1], lease)
        return TransitionResult(task_id=row.task_id, outcome=Outcome.STARTED, lease_expires_at=lease)

    async def renew_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        """Extend leases that are still valid: running by the run lease, reserved by the reservation lease."""
        return await self._transition("renew.locked", list(items), _pair, self._decide_renew)

    def _decide_renew(self, row: _Row, item: tuple[str, str], writes: _Writes, _: Any) -> TransitionResult:
        refused = _not_owned(row, item[1], LIVE_STATES, settled_ok=False)
        if refused is not None:
            return refused
        if not row.lease_valid:
            # An expired lease is lost even if the sweeper has not run yet.
            return _lost(row.task_id, LostReason.LEASE_EXPIRED)
        lease_s = self.run_lease_s if row.state == "running" else self.reservation_lease_s
        lease = row.now + timedelta(seconds=lease_s)
        writes.renew(row, lease)
        return TransitionResult(
            task_id=row.task_id, outcome=Outcome.RENEWED, lease_expires_at=lease,
            cancel_requested=row.cancel_requested, deadline_passed=row.past_deadline,
        )

    async def release_many(self, items: Iterable[tuple[str, str]]) -> list[TransitionResult]:
        """Give back reservations that will not be started: queued again, no attempt used."""
        return await self._transition("release.locked", list(items), _pair, self._decide_release)

    def _decide_release(self, row: _Row, item: tuple[str, str], writes: _Writes, _: Any) -> TransitionResult:
        refused = _not_owned(row, item[1], ("reserved",), settled_ok=True)
        if refused is not None:
            return refused
        return TransitionResult(task_id=row.task_id, outcome=_unstarted_back(row, writes, attempt_outcome="released"))

    async def finish_many(self, items: Iterable[FinishItem]) -> list[TransitionResult]:
        """Record results and failures; retry with backoff or settle; release the resource key."""
        return await self._transition("finish.locked", list(items), _finish_key, self._decide_finish, _recorded_finishes)

    def _decide_finish(
        self, row: _Row, item: FinishItem, writes: _Writes, recorded: Mapping[tuple[str, str], Mapping[str, Any]]
    ) -> TransitionResult:
        task_id = row.task_id
        if row.fencing_token != item.token or row.state != "running":
            attempt = recorded.get((item.task_id, item.token))
            if attempt is not None and attempt["started_at"] is not None and attempt["outcome"] in FINISH_OUTCOMES:
                # The same attempt finished before: answer with what was recorded, write nothing.
                return TransitionResult(task_id=task_id, outcome=Outcome(attempt["outcome"]), duplicate=True)
            reason = LostReason.TOKEN_MISMATCH if row.fencing_token != item.token else LostReason.WRONG_STATE
            return _lost(task_id, reason)
        if not row.lease_valid:
            # An expired lease is lost even if the sweeper has not run yet.
            return _lost(task_id, LostReason.LEASE_EXPIRED)
        if item.error is None:
            writes.close_attempt(row, "succeeded")
            writes.settle(row, "succeeded", result=item.result_json)
            return TransitionResult(task_id=task_id, outcome=Outcome.SUCCEEDED)
        error = error_json(item.error)
        outcome, available_at = self._after_failure(row, retryable=item.retryable)
        writes.close_attempt(row, outcome.value, error)
        if outcome is Outcome.RETRY:
            writes.back_to_queue(row, available_at=available_at, error=error)
        else:
            writes.settle(row, outcome.value, error=error)
        return TransitionResult(task_id=task_id, outcome=outcome, available_at=available_at)

    def _after_failure(self, row: _Row, *, retryable: bool) -> tuple[Outcome, datetime | None]:
        """Where a failed started attempt leaves the task: retry, failed, cancelled or expired."""
        if row.cancel_requested:
            return Outcome.CANCELLED, None
        if not retryable or row.attempts >= row.max_attempts:
            return Outcome.FAILED, None
        if row.past_deadline:
            return Outcome.EXPIRED, None
        delay_ms = backoff_delay_ms(
            row.attempts,
            initial_ms=row.backoff_initial_ms,
            max_ms=row.backoff_max_ms,
            multiplier=row.backoff_multiplier,
            rng=self.rng,
        )
        available_at = row.now + timedelta(milliseconds=delay_ms)
        if row.deadline is not None and available_at >= row.deadline:
            # It could never start again before its deadline.
            return Outcome.EXPIRED, None
        return Outcome.RETRY, available_at

    # Single-item conveniences: OwnershipLost instead of an outcome.

    async def start(self, task_id: str, token: str) -> TransitionResult:
        return _raise_lost((await self.start_many([(task_id, token)]))[0])

    async def renew(self, task_id: str, token: str) -> TransitionResult:
        return _raise_lost((await self.renew_many([(task_id, token)]))[0])

    async def finish(
        self,
        task_id: str,
        token: str,
        *,
        result_json: str | None = None,
        error: dict[str, Any] | None = None,
        retryable: bool = False,
    ) -> TransitionResult:
        item = FinishItem(task_id, token, result_json, error, retryable)
        return _raise_lost((await self.finish_many([item]))[0])

    async def release(self, task_id: str, token: str) -> TransitionResult:
        return _raise_lost((await self.release_many([(task_id, token)]))[0])

    # -- recovery ----------------------------------------------------------------------

    async def recover(self, *, limit: int = RECOVERY_BATCH) -> RecoveryStats:
        """One sweep pass over expired leases and queued tasks past their deadline.

        Safe to run on every node at once: candidates are read without locks and then
        locked by primary key with SKIP LOCKED and re-checked against NOW(6), so two
        sweepers (or a sweeper and a Finish) never settle the same row twice, and a
        lease that is still valid on the database clock is never touched.
        """

        async def body(tx: Tx) -> RecoveryStats:
            leases = await tx.fetchall("recover_lease_candidates", {"limit": limit})
            deadlines = await tx.fetchall("recover_deadline_candidates", {"limit": limit})
            if not leases and not deadlines:
                return RecoveryStats()
            ids = tuple(sorted({r["task_id"] for r in leases + deadlines}))
            rows = [_Row.from_row(r) for r in await tx.fetchall("recover_lock", {"task_ids": ids})]
            await self._at("recover.locked", [r.task_id for r in rows])
            writes = _Writes()
            counts = {o: 0 for o in Outcome}
            for row in rows:
                counts[self._recover_row(row, writes)] += 1
            await writes.apply(tx)
            return RecoveryStats(
                requeued=counts[Outcome.RELEASED],
                retried=counts[Outcome.RETRY],
                failed=counts[Outcome.FAILED],
                cancelled=counts[Outcome.CANCELLED],
                expired=counts[Outcome.EXPIRED],
                saturated=len(leases) >= limit or len(deadlines) >= limit,
            )

        return await self.db.transaction(body)

    def _recover_row(self, row: _Row, writes: _Writes) -> Outcome:
        if row.state == "queued":
            # Past its deadline (the only queued rows the sweeper locks).
            writes.settle(row, "expired", error=DEADLINE_ERROR)
            return Outcome.EXPIRED
        if row.state == "reserved":
            return _unstarted_back(row, writes, attempt_outcome="reservation_expired")
        # A running attempt whose lease expired counts as a failed attempt.
        writes.close_attempt(row, "lease_expired", LEASE_ERROR)
        outcome, available_at = self._after_failure(row, retryable=True)
        if outcome is Outcome.RETRY:
            writes.back_to_queue(row, available_at=available_at, error=LEASE_ERROR)
        else:
            writes.settle(row, outcome.value, error=CANCELLED_ERROR if outcome is Outcome.CANCELLED else LEASE_ERROR)
        return outcome

    # -- explanation -------------------------------------------------------------------

    async def explain(self, namespace_id: str, task_id: str) -> dict[str, Any]:
        """Why a task is (not) being dispatched right now, as a JSON-ready dict.

        Read-only, one consistent snapshot. Raises NotFound for unknown tasks and for
        tasks of another namespace (their existence is not revealed).
        """
        if not is_hex32(task_id) or not is_hex32(namespace_id):
            raise NotFound(f"task {task_id} not found", field="task_id")

        async def body(tx: Tx) -> dict[str, Any]:
            row = await tx.fetchone("explain_task", {"task_id": task_id, "namespace_id": namespace_id})
            if row is None:
                raise NotFound(f"task {task_id} not found", field="task_id")
            return await _explain(tx, row)

        return await self.db.transaction(body, isolation="REPEATABLE READ")


def _raise_lost(result: TransitionResult) -> TransitionResult:
    if result.outcome is Outcome.OWNERSHIP_LOST:
        assert result.lost_reason is not None
        raise OwnershipLost(result.task_id, result.lost_reason)
    return result


async def _recorded_finishes(
    tx: Tx, rows: Mapping[str, _Row], keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], Mapping[str, Any]]:
    """Attempt rows of finishes whose token is not the running attempt's (possible duplicates)."""
    stale = [
        (task_id, token)
        for task_id, token in keys
        if (row := rows.get(task_id)) is not None and (row.fencing_token != token or row.state != "running")
    ]
    if not stale:
        return {}
    params = {"task_ids": tuple(sorted({t for t, _ in stale})), "pairs": tuple(stale)}
    return {(a["task_id"], a["fencing_token"]): a for a in await tx.fetchall("transition_attempts", params)}


def _unstarted_back(row: _Row, writes: _Writes, *, attempt_outcome: str) -> Outcome:
    """A reservation that was never started goes back to the queue (no attempt used),
    unless it can no longer run: cancel requested or deadline passed."""
    if row.cancel_requested:
        writes.close_attempt(row, attempt_outcome, CANCELLED_ERROR)
        writes.settle(row, "cancelled", error=CANCELLED_ERROR)
        return Outcome.CANCELLED
    if row.past_deadline:
        writes.close_attempt(row, attempt_outcome, DEADLINE_ERROR)
        writes.settle(row, "expired", error=DEADLINE_ERROR)
        return Outcome.EXPIRED
    writes.close_attempt(row, attempt_outcome)
    writes.back_to_queue(row)
    return Outcome.RELEASED


# -- the claim transaction -----------------------------------------------------------------


@attrs.define(eq=False)
class _Claim:
    """One run of a claim transaction body (rebuilt from scratch on every replay)."""

    store: DispatchStore
    tx: Tx
    req: ClaimRequest
    queue_ids: tuple[str, ...]
    capabilities: tuple[tuple[str, str, str], ...]
    limit: int
    # Candidates already considered in this transaction (locked, skipped or blocked by a key).
    tried: set[str] = attrs.field(factory=set)
    # Resource keys this claim holds or saw missing (no occupancy row yet).
    keys_taken: set[str] = attrs.field(factory=set)
    keys_missing: set[str] = attrs.field(factory=set)
    writes: _Writes = attrs.field(factory=_Writes)

    async def run(self) -> list[Reservation]:
        tx, req = self.tx, self.req
        gates = await tx.fetchall(
            "claim_gates",
            {"namespace_id": req.namespace_id, "application_id": req.application_id, "queue_ids": self.queue_ids},
        )
        if not gates or gates[0]["app_suspended"]:
            return []
        order = {queue_id: index for index, queue_id in enumerate(self.queue_ids)}
        queues = sorted((g for g in gates if not g["paused"]), key=lambda g: order[g["queue_id"]])
        if not queues:
            return []
        app_budget = await self._application_budget(gates[0])
        if app_budget is not None and app_budget.remaining == 0:
            return []
        queue_budgets = await self._queue_budgets(queues)

        limit = self.limit if app_budget is None else min(self.limit, app_budget.remaining)
        taken: list[Mapping[str, Any]] = []
        per_queue: dict[str, int] = {}
        for gate in queues:
            queue_id = gate["queue_id"]
            want = limit - len(taken)
            if want <= 0:
                break
            budget = queue_budgets.get(queue_id)
            if budget is not None:
                want = min(want, budget.remaining)
            if want <= 0:
                continue
            rows = await self._claim_queue(queue_id, want)
            taken.extend(rows)
            per_queue[queue_id] = len(rows)
        await self.writes.apply(tx)
        if not taken:
            return []
        reservations, reserved_at = await self._reserve(taken)
        # Start-rate windows count in the second the reservations carry (reserved_at).
        reserved_s = epoch_second(reserved_at)
        if app_budget is not None and app_budget.window_s is not None:
            window_s, count = window_after(app_budget, len(taken), reserved_s)
            await tx.execute(
                "claim_application_window",
                {"application_id": req.application_id, "window_s": window_s, "window_count": count},
            )
        for queue_id, count in per_queue.items():
            budget = queue_budgets.get(queue_id)
            if count and budget is not None and budget.window_s is not None:
                window_s, total = window_after(budget, count, reserved_s)
                await tx.execute("claim_queue_window", {"queue_id": queue_id, "window_s": window_s, "window_count": total})
        await self.store._at("claim.reserved", [r.task_id for r in reservations])
        return reservations

    async def _application_budget(self, gate: Mapping[str, Any]) -> _Budget | None:
        if gate["app_max_concurrent"] is None and gate["app_max_starts"] is None:
            return None
        app = await self.tx.fetchone("claim_lock_application", {"application_id": self.req.application_id})
        if app is None or app["suspended"]:
            return _Budget(0)
        live = 0
        if app["max_concurrent_executions"] is not None:
            row = await self.tx.fetchone("claim_count_application_live", {"application_id": self.req.application_id})
            live = row["live"]
        return quota_budget(
            max_concurrent=app["max_concurrent_executions"],
            live=live,
            max_per_second=app["max_starts_per_second"],
            window_s=app["start_window_s"],
            window_count=app["start_window_count"],
            now_s=app["now_s"],
        )

    async def _queue_budgets(self, queues: Sequence[Mapping[str, Any]]) -> dict[str, _Budget]:
        controlled = sorted(
            g["queue_id"] for g in queues if g["max_concurrency"] is not None or g["max_starts_per_second"] is not None
        )
        budgets: dict[str, _Budget] = {}
        if not controlled:
            return budgets
        for row in await self.tx.fetchall("claim_lock_queues", {"queue_ids": tuple(controlled)}):
            queue_id = row["queue_id"]
            if row["paused"]:
                budgets[queue_id] = _Budget(0)
                continue
            live = 0
            if row["max_concurrency"] is not None:
                live = (await self.tx.fetchone("claim_count_queue_live", {"queue_id": queue_id}))["live"]
            budgets[queue_id] = quota_budget(
                max_concurrent=row["max_concurrency"],
                live=live,
                max_per_second=row["max_starts_per_second"],
                window_s=row["start_window_s"],
                window_count=row["start_window_count"],
                now_s=row["now_s"],
            )
        return budgets

    async def _claim_queue(self, queue_id: str, want: int) -> list[Mapping[str, Any]]:
        """Lock and keep up to ``want`` due tasks of one queue, in dispatch order."""
        taken: list[Mapping[str, Any]] = []
        contended = False
        for _ in range(MAX_CLAIM_ROUNDS):
            need = want - len(taken)
            if need <= 0:
                break
            read_limit = (need + len(self.tried)) * (CONTENDED_LOOKAHEAD if contended else 1)
            candidates = await self.tx.fetchall(
                "claim_candidates",
                {
                    "queue_id": queue_id,
                    "capabilities": self.capabilities,
                    "resource_keys": 1 if self.req.resource_key_support else 0,
                    "limit": read_limit,
                },
            )
            fresh = [c for c in candidates if c["task_id"] not in self.tried]
            if contended:
                fresh = self.store.rng.sample(fresh, len(fresh))
            picked = await self._pick(fresh, need)
            if picked:
                rows = await self.tx.fetchall("claim_lock_tasks", {"task_ids": tuple(c["task_id"] for c in picked)})
                contended = contended or len(rows) < len(picked)
                # The lock statement returns rows in primary-key order; keep dispatch order.
                by_id = {r["task_id"]: r for r in rows}
                locked = [by_id[c["task_id"]] for c in candidates if c["task_id"] in by_id]
                await self.store._at("claim.locked", [r["task_id"] for r in locked])
                taken.extend(await self._take_keys(self._settle_unrunnable(locked)))
            if len(candidates) < read_limit:
                break  # the queue has no further candidates
        return taken

    async def _pick(self, candidates: Sequence[Mapping[str, Any]], need: int) -> list[Mapping[str, Any]]:
        """The next ``need`` candidates worth locking: not blocked by an occupied resource key."""
        keys = {c["resource_key"] for c in candidates if c["resource_key"] is not None} - self.keys_taken
        free: dict[str, bool] = {}
        if keys:
            rows = await self.tx.fetchall(
                "claim_key_state", {"namespace_id": self.req.namespace_id, "keys": tuple(sorted(keys))}
            )
            free = {r["resource_key"]: _key_free(r) for r in rows}
            self.keys_missing |= keys - set(free)
        picked: list[Mapping[str, Any]] = []
        picked_keys: set[str] = set()
        for candidate in candidates:
            if len(picked) >= need:
                break
            self.tried.add(candidate["task_id"])
            key = candidate["resource_key"]
            if key is not None:
                if key in self.keys_taken or key in picked_keys or not free.get(key, True):
                    continue
                picked_keys.add(key)
            picked.append(candidate)
        return picked

    def _settle_unrunnable(self, locked: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Settle locked candidates that can never run; they do not count toward the batch."""
        runnable = []
        for row in locked:
            # A queued task holds no resource key: settling it releases nothing.
            task = attrs.evolve(_Row.from_row(row), resource_key=None)
            if row["past_deadline"]:
                self.writes.settle(task, "expired", error=DEADLINE_ERROR)
            elif row["cancel_requested"]:
                self.writes.settle(task, "cancelled", error=CANCELLED_ERROR)
            elif row["attempts"] >= row["max_attempts"]:
                self.writes.settle(task, "failed", error=ATTEMPTS_ERROR)
            else:
                runnable.append(row)
        return runnable

    async def _take_keys(self, rows: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Occupy the resource key of each keyed row; rows whose key is taken are dropped."""
        keys = sorted({r["resource_key"] for r in rows if r["resource_key"] is not None})
        if not keys:
            return rows
        ns = self.req.namespace_id
        locked = {
            r["resource_key"]: r
            for r in await self.tx.fetchall("claim_lock_keys", {"namespace_id": ns, "keys": tuple(keys)})
        }
        held = tuple(sorted(k for k, r in locked.items() if r["holder_task_id"] is not None))
        holders_free: dict[str, bool] = {}
        if held:
            for r in await self.tx.fetchall("claim_key_state", {"namespace_id": ns, "keys": held}):
                holders_free[r["resource_key"]] = _key_free(r)
        kept = []
        for row in rows:
            key = row["resource_key"]
            if key is None:
                kept.append(row)
                continue
            params = {"namespace_id": ns, "resource_key": key, "task_id": row["task_id"]}
            if key in locked:
                if locked[key]["holder_task_id"] is not None and not holders_free.get(key, False):
                    continue
                await self.tx.execute("claim_hold_key", params)
            elif key not in self.keys_missing or await self.tx.execute("claim_insert_key", params) != 1:
                # Locked by another transaction, or created concurrently: not ours this time.
                continue
            self.keys_taken.add(key)
            kept.append(row)
        return kept

    async def _reserve(self, rows: Sequence[Mapping[str, Any]]) -> tuple[list[Reservation], datetime]:
        # The latest lock statement's NOW(6): every reservation of the claim carries it.
        now = max(r["now"] for r in rows)
        lease = now + timedelta(seconds=self.store.reservation_lease_s)
        tokens = {r["task_id"]: f"{r['attempts'] + 1}-{secrets.token_hex(8)}" for r in rows}
        task_ids = tuple(tokens)
        changed = await self.tx.execute(
            "claim_reserve",
            {
                "values": json.dumps(tokens),
                "task_ids": task_ids,
                "node_id": self.req.node_id,
                "connection_id": self.req.connection_id,
                "now": now,
                "lease_expires_at": lease,
            },
        )
        if changed != len(rows):
            # Impossible while we hold the row locks; refuse to hand out anything.
            raise DatabaseError(f"claim reserved {changed} of {len(rows)} locked tasks")
        await self.tx.execute("claim_insert_attempts", {"task_ids": task_ids})
        reservations = [
            Reservation(
                task_id=r["task_id"],
                queue_id=r["queue_id"],
                namespace_id=r["namespace_id"],
                application_id=r["application_id"],
                handler=r["handler"],
                handler_version=r["handler_version"],
                payload_version=r["payload_version"],
                payload_json=r["payload"],
                priority=r["priority"],
                attempt=r["attempts"] + 1,
                max_attempts=r["max_attempts"],
                fencing_token=tokens[r["task_id"]],
                lease_expires_at=lease,
                deadline=r["deadline"],
                resource_key=r["resource_key"],
                available_at=r["available_at"],
            )
            for r in rows
        ]
        return reservations, now


def _key_free(row: Mapping[str, Any]) -> bool:
    """A resource key is free without a holder, or when its holder no longer holds it
    (a repair: every transition releases the key in the same transaction)."""
    return row["holder_task_id"] is None or row["holder_state"] not in LIVE_STATES


# -- explanation ---------------------------------------------------------------------------


def _because(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"code": code, "message": message, **details}


async def _explain(tx: Tx, task: Mapping[str, Any]) -> dict[str, Any]:
    now: datetime = task["now"]
    state = task["state"]
    explanation: dict[str, Any] = {
        "task_id": task["task_id"],
        "queue_id": task["queue_id"],
        "queue": task["queue_name"],
        "state": state,
        "handler": task["handler"],
        "handler_version": task["handler_version"],
        "payload_version": task["payload_version"],
        "priority": task["priority"],
        "available_at": rfc3339(task["available_at"]),
        "dispatch_at": rfc3339(task["dispatch_at"]),
        "deadline": rfc3339(task["deadline"]),
        "attempts": task["attempts"],
        "max_attempts": task["max_attempts"],
        "resource_key": task["resource_key"],
        "database_now": rfc3339(now),
        "dispatchable": False,
        "reasons": [],
        "position": None,
        "capable_connections": None,
    }
    reasons: list[dict[str, Any]] = explanation["reasons"]
    if state != "queued":
        details: dict[str, Any] = {}
        if state in LIVE_STATES:
            details = {
                "owner_node_id": task["owner_node_id"],
                "connection_id": task["connection_id"],
                "lease_expires_at": rfc3339(task["lease_expires_at"]),
            }
        reasons.append(_because("NOT_QUEUED", f"the task is {state}, not waiting in its queue", **details))
        return explanation

    if task["cancel_requested"]:
        reasons.append(_because("CANCEL_REQUESTED", "cancellation was requested; the next claim settles it"))
    if task["deadline"] is not None and task["deadline"] <= now:
        reasons.append(_because("DEADLINE_PASSED", "the deadline passed; it will be settled as expired"))
    if task["attempts"] >= task["max_attempts"]:
        reasons.append(_because("OUT_OF_ATTEMPTS", "no attempts are left; it will be settled as failed"))
    if task["available_at"] > now:
        due_in = (task["available_at"] - now).total_seconds()
        reasons.append(_because("NOT_DUE", f"not due for another {due_in:.3f} s", due_in_s=due_in))
    if task["queue_paused"]:
        reasons.append(_because("QUEUE_PAUSED", f"queue {task['queue_name']!r} is paused"))
    if task["app_suspended"]:
        reasons.append(_because("APPLICATION_SUSPENDED", "the application is suspended"))
    reasons.extend(await _quota_reasons(tx, task))
    if task["resource_key"] is not None:
        keys = await tx.fetchall(
            "claim_key_state", {"namespace_id": task["namespace_id"], "keys": (task["resource_key"],)}
        )
        if keys and not _key_free(keys[0]):
            holder = keys[0]["holder_task_id"]
            reasons.append(
                _because("RESOURCE_KEY_HELD", f"resource key held by task {holder}", holder_task_id=holder)
            )
    capable = await _capable_connections(tx, task)
    explanation["capable_connections"] = capable
    if capable == 0:
        reasons.append(
            _because(
                "NO_CAPABLE_WORKER",
                "no connected Worker serves this queue with this handler, handler_version and payload_version"
                + (" and resource-key support" if task["resource_key"] is not None else ""),
            )
        )
    if task["available_at"] <= now:
        position = await tx.fetchone(
            "explain_position",
            {
                "queue_id": task["queue_id"],
                "dispatch_at": task["dispatch_at"],
                "available_at": task["available_at"],
                "task_id": task["task_id"],
                "handler": task["handler"],
                "handler_version": task["handler_version"],
                "payload_version": task["payload_version"],
                "cap": POSITION_CAP,
            },
        )
        explanation["position"] = {
            "order": ["dispatch_at", "available_at", "task_id"],
            "due_tasks_ahead": int(position["ahead"]),
            "due_tasks_ahead_same_capability": int(position["ahead_same_capability"]),
            # True when the count stopped at POSITION_CAP: at least that many are ahead.
            "capped": int(position["ahead"]) >= POSITION_CAP,
        }
    explanation["dispatchable"] = not reasons
    return explanation


async def _quota_reasons(tx: Tx, task: Mapping[str, Any]) -> list[dict[str, Any]]:
    reasons = []
    for scope, max_concurrent, max_starts, window_s, window_count, count_query, key in (
        ("APPLICATION", task["app_max_concurrent"], task["app_max_starts"], task["app_window_s"],
         task["app_window_count"], "claim_count_application_live", {"application_id": task["application_id"]}),
        ("QUEUE", task["queue_max_concurrency"], task["queue_max_starts"], task["queue_window_s"],
         task["queue_window_count"], "claim_count_queue_live", {"queue_id": task["queue_id"]}),
    ):
        live = 0
        if max_concurrent is not None:
            live = (await tx.fetchone(count_query, key))["live"]
            if live >= max_concurrent:
                reasons.append(
                    _because(
                        f"{scope}_CONCURRENCY_FULL",
                        f"{scope.lower()} runs {live} of at most {max_concurrent} tasks",
                        live=live,
                        limit=max_concurrent,
                    )
                )
        if max_starts is not None:
            budget = quota_budget(
                max_concurrent=None, live=0, max_per_second=max_starts,
                window_s=window_s, window_count=window_count, now_s=task["now_s"],
            )
            if budget.remaining == 0:
                reasons.append(
                    _because(
                        f"{scope}_START_RATE_EXHAUSTED",
                        f"{scope.lower()} used its {max_starts} starts of this second",
                        limit=max_starts,
                    )
                )
    return reasons


async def _capable_connections(tx: Tx, task: Mapping[str, Any]) -> int:
    """Worker connections of live nodes that could take this task (queue, capability, key support)."""
    wanted = [task["handler"], task["handler_version"], task["payload_version"]]
    count = 0
    for conn in await tx.fetchall(
        "explain_workers", {"namespace_id": task["namespace_id"], "stale_s": WORKER_STALE_S}
    ):
        if not conn["alive"]:
            continue
        if task["resource_key"] is not None and not conn["resource_key_support"]:
            continue
        try:
            queues = json.loads(conn["queues"])
            capabilities = json.loads(conn["capabilities"])
        except (TypeError, ValueError):
            continue
        if task["queue_id"] in queues and any(list(c) == wanted for c in capabilities if isinstance(c, list)):
            count += 1
    return count
