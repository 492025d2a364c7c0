"""The transitions of a reserved or running task: Start, renew, Finish, release, and the
recovery sweep over expired leases and passed deadlines.

Every transition is a compare-and-set on (task, fencing token, state, lease still valid
on the database clock), decided on rows locked by primary key; losing it is a typed
outcome (``Outcome.OWNERSHIP_LOST``), never a crash. The decisions of one transaction
are collected in ``Writes`` and applied with a handful of batch statements.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import attrs

from orbit_protocol.limits import MAX_ERROR_MESSAGE_CHARS

from ..db import Database, Tx
from ..domain.backoff import backoff_delay_ms
from ..domain.ownership import (
    LIVE_STATES,
    At,
    AttachItem,
    FinishItem,
    LostReason,
    Outcome,
    TransitionResult,
)
from .dependencies import defer_failures, release_children

# Default rows per recovery transaction: a sweep pass stays a few milliseconds long.
RECOVERY_BATCH = 256
# The tasks.error column is TEXT (64 KiB). Larger error objects are cut down to their
# code and the start of their message.
MAX_ERROR_BYTES = 16 * 1024
# Attempt outcomes written by Finish (the attempt had started). A Finish repeated with
# the same token is answered from these and writes nothing.
FINISH_OUTCOMES = frozenset({"succeeded", "retry", "failed", "cancelled", "expired"})


def error_json(error: Mapping[str, Any]) -> str:
    """The stored text of an error object, cut down to fit the column if needed."""
    text = json.dumps(error, ensure_ascii=False, separators=(",", ":"), default=str)
    if len(text.encode("utf-8")) <= MAX_ERROR_BYTES:
        return text
    message = str(error.get("message", ""))[:MAX_ERROR_MESSAGE_CHARS]
    kept: dict[str, Any] = {"code": str(error.get("code", "ERROR"))[:128], "message": message, "truncated": True}
    text = json.dumps(kept, ensure_ascii=False, separators=(",", ":"))
    traceback = error.get("traceback")
    if isinstance(traceback, str):
        # The traceback's end (where the handler failed) in what room is left; its text
        # grows by at most 6 bytes a character once escaped in JSON.
        room = (MAX_ERROR_BYTES - len(text.encode("utf-8")) - 32) // 6
        if room > 0:
            kept["traceback"] = traceback[-room:]
            text = json.dumps(kept, ensure_ascii=False, separators=(",", ":"))
    return text


def _reason(code: str, message: str) -> str:
    return error_json({"code": code, "message": message})


DEADLINE_ERROR = _reason("DEADLINE_EXCEEDED", "the deadline passed before the task could start")
ATTEMPTS_ERROR = _reason("ATTEMPTS_EXHAUSTED", "the task has no attempts left")
CANCELLED_ERROR = _reason("CANCELLED", "cancellation was requested")
LEASE_ERROR = _reason("LEASE_EXPIRED", "the run lease expired without renewal or finish")


@attrs.frozen
class TaskRow:
    """A task row locked by a transition or by the sweeper."""

    task_id: str
    namespace_id: str
    queue_id: str
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
    def from_row(cls, row: Mapping[str, Any]) -> TaskRow:
        return cls(
            task_id=row["task_id"],
            namespace_id=row["namespace_id"],
            queue_id=row["queue_id"],
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


@attrs.define(eq=False)
class Writes:
    """The writes one transaction decided, applied as a handful of batch statements.

    Per-task values are keyed by task id and named as the per-row columns of the settle
    statements (``settle_terminal``, ``settle_requeue``, ``settle_attempts`` in
    db/sql/leases.sql, run by ``Tx.execute_per_row``; an attempt's token names its row
    instead); a value left out is NULL.
    """

    # reserved -> running: task id -> token, with the run lease and the lock statement's NOW(6).
    started: dict[str, str] = attrs.field(factory=dict)
    start_now: datetime | None = None
    start_lease: datetime | None = None
    renewals: dict[datetime, list[str]] = attrs.field(factory=dict)
    # Running tasks a new connection adopted: (node id, connection id) -> task ids.
    attachments: dict[tuple[str, str], list[str]] = attrs.field(factory=dict)
    # Attempts closed: task id -> token, outcome and error.
    attempts: dict[str, dict[str, str]] = attrs.field(factory=dict)
    # Terminal: state, result and error; requeued: available_at (None keeps it) and error (None keeps it).
    terminal: dict[str, dict[str, str]] = attrs.field(factory=dict)
    requeue: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    keys: dict[str, tuple[str, str]] = attrs.field(factory=dict)
    # The tasks of the transaction known to have children (000027), when their edges were
    # read; None: not known, and every task that ends without success is looked up.
    parents: frozenset[str] | None = None

    def start(self, row: TaskRow, token: str, lease: datetime) -> None:
        self.started[row.task_id] = token
        self.start_now, self.start_lease = row.now, lease

    def renew(self, row: TaskRow, lease: datetime) -> None:
        self.renewals.setdefault(lease, []).append(row.task_id)

    def attach(self, row: TaskRow, node_id: str, connection_id: str) -> None:
        self.attachments.setdefault((node_id, connection_id), []).append(row.task_id)

    def close_attempt(self, row: TaskRow, outcome: str, error: str | None = None) -> None:
        """Record the outcome of the row's current attempt (the one its token names)."""
        if row.fencing_token is None:
            return
        values = {"token": row.fencing_token, "outcome": outcome}
        if error is not None:
            values["error"] = error
        self.attempts[row.task_id] = values

    def settle(self, row: TaskRow, state: str, *, result: str | None = None, error: str | None = None) -> None:
        self.terminate(row.task_id, state, result=result, error=error)
        self._release_key(row)

    def terminate(self, task_id: str, state: str, *, result: str | None = None, error: str | None = None) -> None:
        """The task's terminal state, result and error: all that settling a task that
        holds no resource key writes (``settle`` releases a row's key as well)."""
        values = {"state": state}
        if result is not None:
            values["result"] = result
        if error is not None:
            values["error"] = error
        self.terminal[task_id] = values

    def back_to_queue(self, row: TaskRow, *, available_at: datetime | None = None, error: str | None = None) -> None:
        self.requeue[row.task_id] = {"available_at": available_at, "error": error}
        self._release_key(row)

    def _release_key(self, row: TaskRow) -> None:
        if row.resource_key is not None:
            self.keys[row.task_id] = (row.namespace_id, row.resource_key)

    async def apply(self, tx: Tx) -> None:
        """Single-table UPDATEs by primary key only: none needs an internal temporary table.
        Their answers are not read, so they are deferred: they reach the server with the
        transaction's commit, in one round trip."""
        if self.started:
            params = {"task_ids": tuple(self.started), "now": self.start_now, "lease_expires_at": self.start_lease}
            tx.defer("start_tasks", params)
            named = tuple(f"{task_id} {token}" for task_id, token in self.started.items())
            tx.defer("start_attempts", {**params, "attempts": named})
        for lease, renewed in self.renewals.items():
            tx.defer("renew_tasks", {"task_ids": tuple(renewed), "lease_expires_at": lease})
        for (node_id, connection_id), attached in self.attachments.items():
            tx.defer("attach_tasks", {"task_ids": tuple(attached), "node_id": node_id, "connection_id": connection_id})
        if self.keys:
            tx.defer(
                "settle_release_keys",
                {"keys": tuple(sorted(set(self.keys.values()))), "task_ids": tuple(self.keys)},
            )
            # A task may hold its key as a further holder instead (max_running_per_key > 1).
            holders = tuple(sorted((ns, key, task_id) for task_id, (ns, key) in self.keys.items()))
            tx.defer("settle_release_holders", {"holders": holders})
        tx.defer_per_row("settle_terminal", self.terminal)
        failed = [t for t, v in self.terminal.items() if v["state"] != "succeeded"]
        defer_failures(tx, failed if self.parents is None else [t for t in failed if t in self.parents])
        tx.defer_per_row("settle_requeue", self.requeue)
        if self.attempts:
            closed = {
                task_id: {"outcome": v["outcome"], "error": v.get("error")} for task_id, v in self.attempts.items()
            }
            named = tuple(f"{task_id} {v['token']}" for task_id, v in self.attempts.items())
            tx.defer_per_row("settle_attempts", closed, {"attempts": named})


def _lost(task_id: str, reason: LostReason) -> TransitionResult:
    return TransitionResult(task_id=task_id, outcome=Outcome.OWNERSHIP_LOST, lost_reason=reason)


def _not_owned(row: TaskRow, token: str, states: Sequence[str], *, settled_ok: bool) -> TransitionResult | None:
    """The refusal for a token that is not current, a state the transition does not apply
    to, or a lease that expired on the database clock (Start, renew and release alike,
    even if the sweeper has not run yet: the row is then the sweeper's).

    A reservation that Start, release or the sweeper settled as cancelled/expired is
    answered with that outcome when it is named by its own token (``ok`` is
    ``settled_ok``: true for a release, which wanted it gone anyway)."""
    if row.fencing_token != token:
        return _lost(row.task_id, LostReason.TOKEN_MISMATCH)
    if row.state in states:
        return None if row.lease_valid else _lost(row.task_id, LostReason.LEASE_EXPIRED)
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


def _with_state(result: TransitionResult, row: TaskRow) -> TransitionResult:
    """``result`` with the task's state after the transaction. The rules give it already
    where they can (a fresh Start or Finish, every task's path); ``attrs.evolve`` then
    costs nothing."""
    state = row.state if result.duplicate or result.outcome not in _STATE_AFTER else _STATE_AFTER[result.outcome]
    return result if result.state == state else attrs.evolve(result, state=state)


def pair_key(item: tuple[str, str]) -> tuple[str, str]:
    task_id, token = item
    return (str(task_id), str(token))


def finish_key(item: FinishItem) -> tuple[str, str]:
    return (item.task_id, item.token)


def attach_key(item: AttachItem) -> tuple[str, str]:
    return (item.task_id, item.token)


T = TypeVar("T")
# decide(row, item, writes, context) -> result; context comes from the optional prepare step.
Decide = Callable[[TaskRow, Any, Writes, Any], TransitionResult]
Prepare = Callable[[Tx, Mapping[str, TaskRow], Sequence[tuple[str, str]]], Awaitable[Any]]


@attrs.frozen
class TransitionPart:
    """One batch of one transition kind: its items and the rule that decides each.

    Several parts (from several Worker connections) can share one transaction
    (``run_transitions``) as long as no task is named by two of them.
    """

    # The hook point reached once the rows are locked ("start.locked", ...).
    point: str
    items: Sequence[Any]
    # (task_id, token) of an item.
    key: Callable[[Any], tuple[str, str]]
    decide: Decide
    # Read once per transaction for all parts that name it; its result is their context.
    prepare: Prepare | None = None
    # When set, a task of another namespace is answered as one that does not exist: a
    # part whose items are not known to be the connection's own (a Finish of a task this
    # connection does not hold, an attach) may name any task id.
    namespace_id: str | None = None
    # Its tasks may succeed: their children's edges are read with the lock, and the
    # children whose last parent succeeds are released in the transaction (000027).
    releases: bool = False

    def keys(self) -> list[tuple[str, str]]:
        return [self.key(item) for item in self.items]


async def run_transitions(db: Database, at: At, parts: Sequence[TransitionPart]) -> list[list[TransitionResult]]:
    """Lock every task the parts name, decide each item (a compare-and-set on token,
    state and lease), then write all decisions with a few batch statements; one
    transaction. Returns each part's results, in its items' order.

    An item that loses its compare-and-set is an outcome of its own and never fails the
    others. The parts must not name the same task twice (one decision per row per
    transaction); within one part, the same (task, token) twice is applied once.
    """
    if not any(part.items for part in parts):
        return [[] for _ in parts]
    keys = [part.keys() for part in parts]

    releasing = tuple(
        sorted(
            {task_id for part, part_keys in zip(parts, keys, strict=True) if part.releases for task_id, _ in part_keys}
        )
    )

    async def body(tx: Tx) -> list[list[TransitionResult]]:
        task_ids = tuple(sorted({task_id for part_keys in keys for task_id, _ in part_keys}))
        lock = tx.statement("transition_lock", {"task_ids": task_ids})
        edges: list[tuple[str, str]] = []
        if releasing:
            # The edges in the lock's round trip, read after it (000027).
            locked, found = await tx.fetchall_each(lock, tx.statement("dependency_children", {"task_ids": releasing}))
            edges = [(r["parent_task_id"], r["child_task_id"]) for r in found]
        else:
            locked = await tx.fetchall("transition_lock", {"task_ids": task_ids})
        rows = {r["task_id"]: TaskRow.from_row(r) for r in locked}
        for part, part_keys in zip(parts, keys, strict=True):
            if part_keys:
                await at(part.point, sorted({task_id for task_id, _ in part_keys}))
        contexts: dict[Prepare, Any] = {}
        for prepare in {part.prepare for part in parts if part.prepare is not None}:
            prepared = [
                k for part, part_keys in zip(parts, keys, strict=True) if part.prepare is prepare for k in part_keys
            ]
            contexts[prepare] = await prepare(tx, rows, prepared)
        writes = Writes(parents=frozenset(p for p, _ in edges) if releasing else None)
        answers = []
        for part, part_keys in zip(parts, keys, strict=True):
            context = None if part.prepare is None else contexts[part.prepare]
            first: dict[tuple[str, str], TransitionResult] = {}
            results = []
            for item, item_key in zip(part.items, part_keys, strict=True):
                if item_key in first:
                    # The same (task, token) twice in one batch: applied once.
                    results.append(attrs.evolve(first[item_key], duplicate=True))
                    continue
                row = rows.get(item_key[0])
                if row is None or (part.namespace_id is not None and row.namespace_id != part.namespace_id):
                    result = _lost(item_key[0], LostReason.NOT_FOUND)
                else:
                    result = _with_state(part.decide(row, item, writes, context), row)
                first[item_key] = result
                results.append(result)
            answers.append(results)
        arrivals: dict[str, list[tuple[str, datetime | None, float | None]]] = {}
        if edges:
            succeeded = [t for t, v in writes.terminal.items() if v["state"] == "succeeded"]
            arrivals = await release_children(tx, edges, succeeded)
        await writes.apply(tx)
        if arrivals:
            answers = [
                [
                    attrs.evolve(r, released=tuple(arrivals[r.task_id]))
                    if r.task_id in arrivals and r.outcome is Outcome.SUCCEEDED and not r.duplicate
                    else r
                    for r in part
                ]
                for part in answers
            ]
        if writes.keys:
            answers = [
                [attrs.evolve(r, freed_key=True) if r.task_id in writes.keys and not r.duplicate else r for r in part]
                for part in answers
            ]
        return answers

    return await db.transaction(body)


@attrs.frozen
class TransitionRules:
    """What each transition does to a locked row: pure decisions, written into ``Writes``.

    ``decide(row, item, writes, context)`` for ``run_transition``; the leases come from
    the node's configuration, ``rng`` jitters the retry backoff.
    """

    reservation_lease_s: float
    run_lease_s: float
    rng: random.Random

    def start(self, row: TaskRow, item: tuple[str, str], writes: Writes, _: Any) -> TransitionResult:
        refused = _not_owned(row, item[1], LIVE_STATES, settled_ok=False)
        if refused is not None:
            return refused
        if row.state == "running":
            # Start repeated for the attempt that is running: answered, nothing written.
            return TransitionResult(
                task_id=row.task_id,
                outcome=Outcome.STARTED,
                duplicate=True,
                lease_expires_at=row.lease_expires_at,
                cancel_requested=row.cancel_requested,
                deadline_passed=row.past_deadline,
            )
        if row.past_deadline or row.cancel_requested:
            # A task past its deadline is never started; a cancelled one neither.
            state, error = ("expired", DEADLINE_ERROR) if row.past_deadline else ("cancelled", CANCELLED_ERROR)
            writes.close_attempt(row, state, error)
            writes.settle(row, state, error=error)
            return TransitionResult(task_id=row.task_id, outcome=Outcome(state), ok=False)
        lease = row.now + timedelta(seconds=self.run_lease_s)
        writes.start(row, item[1], lease)
        return TransitionResult(
            task_id=row.task_id, outcome=Outcome.STARTED, state=_STATE_AFTER[Outcome.STARTED], lease_expires_at=lease
        )

    def renew(self, row: TaskRow, item: tuple[str, str], writes: Writes, _: Any) -> TransitionResult:
        refused = _not_owned(row, item[1], LIVE_STATES, settled_ok=False)
        if refused is not None:
            return refused
        lease_s = self.run_lease_s if row.state == "running" else self.reservation_lease_s
        lease = row.now + timedelta(seconds=lease_s)
        writes.renew(row, lease)
        return TransitionResult(
            task_id=row.task_id,
            outcome=Outcome.RENEWED,
            lease_expires_at=lease,
            cancel_requested=row.cancel_requested,
            deadline_passed=row.past_deadline,
        )

    def attach(self, row: TaskRow, item: AttachItem, writes: Writes, _: Any) -> TransitionResult:
        """A running task, its token current and its lease valid, moves to a new connection
        of its Worker (after a dropped connection, or a node's drain): the lease is renewed
        and the row names the new node and connection; nothing else changes."""
        if row.namespace_id != item.namespace_id:
            return _lost(row.task_id, LostReason.NOT_FOUND)
        refused = _not_owned(row, item.token, ("running",), settled_ok=False)
        if refused is not None:
            return refused
        lease = row.now + timedelta(seconds=self.run_lease_s)
        writes.renew(row, lease)
        writes.attach(row, item.node_id, item.connection_id)
        return TransitionResult(
            task_id=row.task_id,
            outcome=Outcome.ATTACHED,
            state="running",
            lease_expires_at=lease,
            queue_id=row.queue_id,
            deadline_in_s=None if row.deadline is None else (row.deadline - row.now).total_seconds(),
            cancel_requested=row.cancel_requested,
            deadline_passed=row.past_deadline,
        )

    def release(self, row: TaskRow, item: tuple[str, str], writes: Writes, _: Any) -> TransitionResult:
        refused = _not_owned(row, item[1], ("reserved",), settled_ok=True)
        if refused is not None:
            return refused
        return TransitionResult(task_id=row.task_id, outcome=_unstarted_back(row, writes, attempt_outcome="released"))

    def finish(
        self, row: TaskRow, item: FinishItem, writes: Writes, recorded: Mapping[tuple[str, str], Mapping[str, Any]]
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
            return TransitionResult(task_id=task_id, outcome=Outcome.SUCCEEDED, state=_STATE_AFTER[Outcome.SUCCEEDED])
        error = error_json(item.error)
        outcome, available_at = self._after_failure(row, retryable=item.retryable)
        writes.close_attempt(row, outcome.value, error)
        if outcome is Outcome.RETRY:
            writes.back_to_queue(row, available_at=available_at, error=error)
        else:
            writes.settle(row, outcome.value, error=error)
        backoff_s = None if available_at is None else (available_at - row.now).total_seconds()
        return TransitionResult(task_id=task_id, outcome=outcome, available_at=available_at, backoff_s=backoff_s)

    def finish_recorded(
        self, row: TaskRow, item: FinishItem, writes: Writes, recorded: Mapping[tuple[str, str], Mapping[str, Any]]
    ) -> TransitionResult:
        """A Finish from a connection that does not hold the task: answered only if it
        repeats one already recorded for that token (its ack was lost); nothing is
        written. Ownership moves between connections by re-attaching, not by a Finish."""
        attempt = recorded.get((item.task_id, item.token))
        if attempt is not None and attempt["started_at"] is not None and attempt["outcome"] in FINISH_OUTCOMES:
            return TransitionResult(task_id=row.task_id, outcome=Outcome(attempt["outcome"]), duplicate=True)
        return _lost(row.task_id, LostReason.WRONG_STATE)

    def _after_failure(self, row: TaskRow, *, retryable: bool) -> tuple[Outcome, datetime | None]:
        """Where a failed started attempt leaves the task: cancelled when its cancel was
        requested, expired when its deadline has passed (a deadline bounds the run as well
        as the start: docs/api.md, "Deadlines"), else failed or a retry."""
        if row.cancel_requested:
            return Outcome.CANCELLED, None
        if row.past_deadline:
            return Outcome.EXPIRED, None
        if not retryable or row.attempts >= row.max_attempts:
            return Outcome.FAILED, None
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

    def recover_row(self, row: TaskRow, writes: Writes) -> Outcome:
        """What the sweeper does with a row it locked: past its deadline or its lease."""
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


async def recorded_finishes(
    tx: Tx, rows: Mapping[str, TaskRow], keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], Mapping[str, Any]]:
    """Attempt rows of finishes whose token is not the running attempt's (possible duplicates)."""
    stale = [
        (task_id, token)
        for task_id, token in keys
        if (row := rows.get(task_id)) is not None and (row.fencing_token != token or row.state != "running")
    ]
    return await _attempts_named(tx, stale)


async def all_recorded_finishes(
    tx: Tx, rows: Mapping[str, TaskRow], keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], Mapping[str, Any]]:
    """Attempt rows of every (task, token) named: what a Finish of it recorded, if any."""
    return await _attempts_named(tx, [k for k in keys if k[0] in rows])


async def _attempts_named(tx: Tx, stale: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    if not stale:
        return {}
    params = {"task_ids": tuple(sorted({t for t, _ in stale})), "pairs": tuple(stale)}
    return {(a["task_id"], a["fencing_token"]): a for a in await tx.fetchall("transition_attempts", params)}


def _unstarted_back(row: TaskRow, writes: Writes, *, attempt_outcome: str) -> Outcome:
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
