"""Why a task is (not) being dispatched right now: the explanation behind
``GET /v1/tasks/{id}/explain`` and ``orbit-admin task explain``.

Read-only: one consistent snapshot, no locks, no writes. It checks the same gates a
claim applies (state, due time, pause, suspension, quotas, resource key, a connected
Worker able to run the task) and counts the due tasks ahead of it in dispatch order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

from ..db import Database, Tx
from ..domain.dependencies import SUCCEEDED, WAITING, waiting_summary
from ..domain.errors import NotFound
from ..domain.ids import is_hex32
from ..domain.ownership import LIVE_STATES
from ..domain.quota import quota_budget
from ..domain.wire import rfc3339
from .claim import key_holders, running_per_key
from .dependencies import parents_by_child

# Explanations treat a registered Worker connection as gone when its node missed three
# registry heartbeats (every 10 s) or stopped.
WORKER_STALE_S = 30
# Explanations count the tasks ahead of a task up to this many (an explanation of a task
# deep in a huge backlog stays cheap; the answer then says "at least").
POSITION_CAP = 10_000


async def read_explanation(db: Database, namespace_id: str, task_id: str) -> dict[str, Any]:
    """Why a task is (not) being dispatched right now, as a JSON-ready dict.

    Read-only, one consistent snapshot. Raises NotFound for unknown tasks and for
    tasks of another namespace (their existence is not revealed).
    """
    if not is_hex32(task_id) or not is_hex32(namespace_id):
        raise NotFound(f"task {task_id} not found", field="task_id")

    async def body(tx: Tx) -> dict[str, Any]:
        row = await tx.fetchone("explain_task", {"task_id": task_id, "namespace_id": namespace_id})
        gates = [] if row is None else await queue_gates(tx, namespace_id, [row["queue_id"]])
        if row is None or not gates:
            raise NotFound(f"task {task_id} not found", field="task_id")
        return await _explain(tx, {**gates[0], **row})

    return await db.transaction(body, isolation="REPEATABLE READ")


def _because(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"code": code, "message": message, **details}


# Pending parents an explanation lists by id at most (it counts them all).
MAX_PENDING_SHOWN = 100


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
    if state == WAITING:
        rows = await tx.fetchall("dependency_parents_of", {"task_ids": (task["task_id"],)})
        parents = parents_by_child(rows).get(task["task_id"], {})
        pending = sorted(p for p, s in parents.items() if s != SUCCEEDED)
        reasons.append(
            _because(
                "WAITING_FOR_PARENTS",
                waiting_summary(parents),
                parents=len(parents),
                pending_parents=pending[:MAX_PENDING_SHOWN],
            )
        )
        return explanation
    if state != "queued":
        details: dict[str, Any] = {}
        if state in LIVE_STATES:
            details = {
                "owner_node_id": task["owner_node_id"],
                "connection_id": task["connection_id"],
                "lease_expires_at": rfc3339(task["lease_expires_at"]),
            }
        reasons.append(_because("NOT_QUEUED", f"the task is {state}, not waiting in its queue", **details))
        if state in LIVE_STATES:
            lost = await holder_gone(tx, task, now)
            if lost is not None:
                reasons.append(lost)
        return explanation

    if task["cancel_requested"]:
        reasons.append(_because("CANCEL_REQUESTED", "cancellation was requested; the next claim settles it"))
    if task["deadline"] is not None and task["deadline"] <= now:
        reasons.append(_because("DEADLINE_PASSED", "the deadline passed; it will be settled as expired"))
    if task["attempts"] >= task["max_attempts"]:
        reasons.append(_because("OUT_OF_ATTEMPTS", "no attempts are left; it will be settled as failed"))
    reasons.extend(gate_reasons(task))
    reasons.extend(await quota_reasons(tx, task))
    if task["resource_key"] is not None:
        held = await key_reason(tx, task)
        if held is not None:
            reasons.append(held)
    capable = capable_connections(await live_connections(tx, task["namespace_id"]), task)
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
        position = await tx.fetchrow(
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


async def queue_gates(tx: Tx, namespace_id: str, queue_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Of each queue of the namespace among ``queue_ids``: its gates and quotas, its
    application's, and the database clock (``now``, ``now_s``)."""
    if not queue_ids:
        return []
    return await tx.fetchall("explain_queue_gates", {"namespace_id": namespace_id, "queue_ids": tuple(queue_ids)})


def gate_reasons(task: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A queued task's due time and its queue's and application's gates (``queue_gates``
    merged with the task's ``available_at``)."""
    reasons = []
    now: datetime = task["now"]
    if task["available_at"] > now:
        due_in = (task["available_at"] - now).total_seconds()
        reasons.append(_because("NOT_DUE", f"not due for another {due_in:.3f} s", due_in_s=due_in))
    if task["queue_paused"]:
        reasons.append(_because("QUEUE_PAUSED", f"queue {task['queue_name']!r} is paused"))
    if task["app_suspended"]:
        reasons.append(_because("APPLICATION_SUSPENDED", "the application is suspended"))
    return reasons


async def held_keys(tx: Tx, namespace_id: str, keys: Sequence[str]) -> dict[str, int]:
    """Of these resource keys, those live tasks hold: key -> how many hold it."""
    if not keys:
        return {}
    rows = await tx.fetchall("claim_key_occupancy", {"namespace_id": namespace_id, "keys": tuple(sorted(set(keys)))})
    return {row["resource_key"]: count for row in rows if (count := key_holders(row))}


def key_full(gate: Mapping[str, Any], holders: int) -> bool:
    """Whether a key with ``holders`` live holders admits no task of the queue of ``gate``
    (a ``queue_gates`` row)."""
    return holders >= running_per_key(gate["queue_max_running_per_key"])


async def key_reason(tx: Tx, task: Mapping[str, Any]) -> dict[str, Any] | None:
    """``RESOURCE_KEY_HELD`` when the task's resource key has as many live holders as its
    queue admits (``max_running_per_key``): which tasks, how many, of how many."""
    key = task["resource_key"]
    rows = await tx.fetchall("explain_key_holders", {"namespace_id": task["namespace_id"], "resource_key": key})
    holders = [row["task_id"] for row in rows]
    if not key_full(task, len(holders)):
        return None
    limit = running_per_key(task["queue_max_running_per_key"])
    return _because(
        "RESOURCE_KEY_HELD",
        f"resource key {key!r} has {len(holders)} of {limit} running"
        + (f" (task {holders[0]})" if len(holders) == 1 else ""),
        holder_task_id=holders[0],
        holder_task_ids=holders,
        running=len(holders),
        limit=limit,
    )


async def quota_reasons(tx: Tx, task: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The application quota and queue controls that admit no more reservations now (of a
    ``queue_gates`` row, with or without a task's columns)."""
    reasons = []
    for scope, max_concurrent, max_starts, window_s, window_count, count_query, key in (
        (
            "APPLICATION",
            task["app_max_concurrent"],
            task["app_max_starts"],
            task["app_window_s"],
            task["app_window_count"],
            "claim_count_application_live",
            {"application_id": task["application_id"]},
        ),
        (
            "QUEUE",
            task["queue_max_concurrency"],
            task["queue_max_starts"],
            task["queue_window_s"],
            task["queue_window_count"],
            "claim_count_queue_live",
            {"queue_id": task["queue_id"]},
        ),
    ):
        live = 0
        if max_concurrent is not None:
            live = (await tx.fetchrow(count_query, key))["live"]
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
                max_concurrent=None,
                live=0,
                max_per_second=max_starts,
                window_s=window_s,
                window_count=window_count,
                now_s=task["now_s"],
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


@attrs.frozen
class Connection:
    """A Worker connection of a live node, as an explanation needs it."""

    queues: tuple[str, ...]
    # (handler, handler_version, payload_version) it declared.
    capabilities: frozenset[tuple[str, str, str]]
    resource_key_support: bool


async def holder_gone(tx: Tx, task: Mapping[str, Any], now: datetime) -> dict[str, Any] | None:
    """``WORKER_GONE`` when the connection a reserved or running task belongs to is no
    longer registered, or its node stopped or stopped heartbeating: when that was known,
    when the lease runs out, and what happens then. None while the holder is live."""
    holder = await tx.fetchone(
        "explain_holder",
        {"node_id": task["owner_node_id"], "connection_id": task["connection_id"], "stale_s": WORKER_STALE_S},
    )
    if holder is None or (holder["node_alive"] and holder["registered"]):
        return None
    if holder["node_id"] is None:
        why = f"its node {task['owner_node_id']} is not registered"
    elif holder["stopped_at"] is not None:
        why = f"its node {task['owner_node_id']} stopped at {rfc3339(holder['stopped_at'])}"
    elif not holder["node_alive"]:
        why = f"its node {task['owner_node_id']} last answered at {rfc3339(holder['heartbeat_at'])}"
    else:
        why = f"its Worker's connection {task['connection_id']} closed"
    lease = task["lease_expires_at"]
    left = max(0.0, (lease - now).total_seconds()) if lease is not None else 0.0
    then = after_lease(task)
    message = (
        f"{why}; its lease runs out at {rfc3339(lease)} (in {left:.0f} s), then {then}, unless its Worker "
        "reconnects first and re-attaches the task"
        if task["state"] == "running"
        else f"{why}; the reservation runs out at {rfc3339(lease)} (in {left:.0f} s), then {then}"
    )
    return _because(
        "WORKER_GONE",
        message,
        connection_id=task["connection_id"],
        owner_node_id=task["owner_node_id"],
        lease_expires_at=rfc3339(lease),
        lease_left_s=round(left, 3),
    )


def after_lease(task: Mapping[str, Any]) -> str:
    """What lease recovery does with the task once its lease is out."""
    if task["state"] == "reserved":
        return "the task goes back to its queue (a reservation uses no attempt)"
    if task["cancel_requested"]:
        return "the task ends cancelled"
    if task["attempts"] >= task["max_attempts"]:
        return f"the task ends failed (attempt {task['attempts']} of {task['max_attempts']} was its last)"
    return f"the task goes back to its queue for attempt {task['attempts'] + 1} of {task['max_attempts']}"


async def live_connections(tx: Tx, namespace_id: str) -> list[Connection]:
    """Worker connections of the namespace registered by live nodes (an unreadable
    registry row counts as no connection: it informs, never decides)."""
    found = []
    for conn in await tx.fetchall("explain_workers", {"namespace_id": namespace_id, "stale_s": WORKER_STALE_S}):
        if not conn["alive"]:
            continue
        try:
            queues = json.loads(conn["queues"])
            capabilities = json.loads(conn["capabilities"])
            found.append(
                Connection(
                    tuple(queues),
                    frozenset(tuple(c) for c in capabilities if isinstance(c, list) and len(c) == 3),
                    bool(conn["resource_key_support"]),
                )
            )
        except (TypeError, ValueError):
            continue
    return found


def capable_connections(connections: Sequence[Connection], task: Mapping[str, Any]) -> int:
    """How many of ``connections`` could take this task (queue, capability, key support)."""
    wanted = (task["handler"], task["handler_version"], task["payload_version"])
    return sum(
        1
        for conn in connections
        if task["queue_id"] in conn.queues
        and wanted in conn.capabilities
        and (task["resource_key"] is None or conn.resource_key_support)
    )
