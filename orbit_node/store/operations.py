"""Operators' repository: what ``orbit-admin`` reads and changes, and the claim-turn counters.

SQL lives in ``db/sql/operations.sql``. Reads lock nothing and decide nothing. Claim turns
are the per-node fairness counters of P3 section 3; each node records its own here (see
``orbit_node.dispatch.turns.TurnRecorder``) so one view can show every node's rotation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

from ..db import Database, Tx
from ..domain.errors import InvalidArgument, NotFound
from ..domain.ids import is_hex32
from ..domain.retention import RetentionClass, parse_duration
from ..domain.rules import fairness_weight
from ..domain.wire import rfc3339, stored_json
from .dependencies import parent_documents, parents_by_child
from .task_rows import PRIORITY_STEP_S

LIVE_STATES = ("queued", "reserved", "running")
# A node whose heartbeat (every 10 s) is older than this is not live for operators.
NODE_STALE_S = 30
# Claim-turn rows of nodes that stopped, or whose heartbeat is older than this, are pruned.
TURNS_STALE_S = 3600
# Minutes of claim-turn history kept (claim_turn_minutes): the console shows the last 15.
TURN_MINUTES_KEPT = 60
# The largest per-application Worker connection limit (the column is INT).
MAX_WORKER_CONNECTIONS = 2_147_483_647


# ``set_submit_rate``'s burst when the caller names none: the stored one stays.
UNCHANGED: Any = object()
# The largest submit rate or burst (the columns are INT).
MAX_RATE_VALUE = 2_147_483_647


def rate_value(value: Any, field: str, *, minimum: int) -> int:
    """A submit rate or burst: an integer from ``minimum`` to 2,147,483,647."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_RATE_VALUE:
        raise InvalidArgument(
            f"{field}: expected an integer from {minimum} to {MAX_RATE_VALUE}, got {value!r}", field=field
        )
    return value


@attrs.frozen(kw_only=True)
class QueueBacklog:
    """One queue with its live tasks by state and its queued tasks by priority level."""

    queue_id: str
    name: str
    namespace: str
    environment: str
    application: str
    paused: bool
    max_concurrency: int | None
    max_starts_per_second: int | None
    max_running_per_key: int = 1
    queued: int = 0
    # Queued tasks whose available_at has come (the rest wait for their time).
    due: int = 0
    reserved: int = 0
    running: int = 0
    # Tasks waiting for their parents (depends_on): not yet in the queue's order.
    waiting: int = 0
    # Queued tasks per priority level (levels with none are left out).
    queued_by_priority: Mapping[int, int] = attrs.field(factory=dict)
    # Seconds the oldest due task has been due (database clock); None without due tasks.
    oldest_due_age_s: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "application": self.application,
            "namespace": self.namespace,
            "environment": self.environment,
            "queue": self.name,
            "queue_id": self.queue_id,
            "paused": self.paused,
            "max_concurrency": self.max_concurrency,
            "max_starts_per_second": self.max_starts_per_second,
            "max_running_per_key": self.max_running_per_key,
            "backlog": {
                "queued": self.queued,
                "due": self.due,
                "scheduled": self.queued - self.due,
                "reserved": self.reserved,
                "running": self.running,
                "waiting": self.waiting,
            },
            "queued_by_priority": {str(level): n for level, n in sorted(self.queued_by_priority.items(), reverse=True)},
        }


@attrs.define(eq=False)
class OperationsStore:
    db: Database

    # -- claim turns (nodes write, operators read) -----------------------------------

    async def record_turns(self, node_id: str, turns: Mapping[str, int]) -> None:
        """Store this node's cumulative turns of the given applications (absolute values)."""
        await self._turns_statement("ops_turns_upsert", node_id, turns)

    async def add_turn_minutes(self, node_id: str, granted: Mapping[str, int]) -> None:
        """Add the turns this node granted the given applications to the current
        database-clock minute (one statement: all of them or none)."""
        await self._turns_statement("ops_turn_minutes_add", node_id, granted)

    async def _turns_statement(self, name: str, node_id: str, turns: Mapping[str, int]) -> None:
        if turns:
            await self.db.execute(
                name,
                {"node_id": node_id, "values": json.dumps(dict(turns)), "application_ids": tuple(sorted(turns))},
            )

    async def recent_turn_minutes(self, minutes: int) -> list[dict[str, Any]]:
        """(application_id, application, minute, turns, current_minute) over the last ``minutes``."""
        return await self.db.fetchall("ops_turn_minutes_recent", {"minutes": minutes})

    async def prune_turn_minutes(self, keep_minutes: int = TURN_MINUTES_KEPT) -> int:
        return await self.db.execute("ops_turn_minutes_prune", {"keep_minutes": keep_minutes})

    async def forget_turns(self, node_id: str) -> None:
        await self.db.execute("ops_turns_forget_node", {"node_id": node_id})

    async def prune_turns(self, stale_s: int = TURNS_STALE_S) -> int:
        return await self.db.execute("ops_turns_prune", {"stale_s": stale_s})

    async def live_turns(self) -> list[dict[str, Any]]:
        """Rows (node_id, application_id, application, turns) of live nodes."""
        return await self.db.fetchall("ops_turns_live", {"stale_s": NODE_STALE_S})

    async def turns_elsewhere(self, node_id: str, application_ids: Collection[str]) -> list[tuple[str, str, int]]:
        """(node_id, application_id, cumulative turns) of the given applications on every live
        node but ``node_id``: what the share across nodes reads once a scan cycle."""
        if not application_ids:
            return []
        applications = json.dumps([{"a": app} for app in sorted(application_ids)])
        rows = await self.db.fetchall(
            "ops_turns_elsewhere", {"node_id": node_id, "stale_s": NODE_STALE_S, "applications": applications}
        )
        return [(r["node_id"], r["application_id"], int(r["turns"])) for r in rows]

    async def live_nodes(self) -> list[dict[str, Any]]:
        rows = await self.db.fetchall("ops_nodes_live", {"stale_s": NODE_STALE_S})
        return [
            {
                "node_id": r["node_id"],
                "hostname": r["hostname"],
                "http_addr": r["http_addr"],
                "version": r["version"],
                "started_at": rfc3339(r["started_at"]),
                "heartbeat_age_s": float(r["heartbeat_age_s"]),
                "connections": int(r["connections"]),
            }
            for r in rows
        ]

    # -- applications, namespaces, credentials -----------------------------------------

    async def applications(self, name: str | None = None) -> list[dict[str, Any]]:
        rows = await self.db.fetchall("ops_applications", {"name": name, "stale_s": NODE_STALE_S})
        if name is not None and not rows:
            raise NotFound(f"application: {name!r} not found", field="application")
        return [
            {
                "application_id": r["application_id"],
                "application": r["name"],
                "suspended": bool(r["suspended"]),
                "max_concurrent_executions": r["max_concurrent_executions"],
                "max_starts_per_second": r["max_starts_per_second"],
                "fairness_weight": int(r["fairness_weight"]),
                # Worker connections one node accepts of it at most (None: its fair share
                # when the node is full, ``workers/slots.py``).
                "max_worker_connections": r["max_worker_connections"],
                # The application's own retention (None: the node's default applies).
                "retain_succeeded_s": r["retain_succeeded_s"],
                "retain_failed_s": r["retain_failed_s"],
                # The submit rate limit across the cluster (None: unlimited) and its burst
                # (None: one second of the rate).
                "submits_per_second": r["submits_per_second"],
                "submit_burst": r["submit_burst"],
                "queued": int(r["queued"]),
                "reserved": int(r["reserved"]),
                "running": int(r["running"]),
                # Worker connections of the application on live nodes (the registry).
                "worker_connections": int(r["worker_connections"]),
            }
            for r in rows
        ]

    async def application(self, name: str) -> dict[str, Any]:
        return (await self.applications(name))[0]

    async def patch_quota(self, name: str, changes: Mapping[str, int | None]) -> dict[str, Any]:
        """Set the named quota fields (None = unlimited), keep the others; returns the application."""
        fields = ("max_concurrent_executions", "max_starts_per_second")
        unknown = set(changes) - set(fields)
        if unknown:
            raise InvalidArgument(f"{sorted(unknown)[0]}: not a quota field", field=sorted(unknown)[0])
        if not changes:
            raise InvalidArgument("quota: name at least one field to change", field="quota")
        for field, value in changes.items():
            if value is not None and (not isinstance(value, int) or value < 0):
                raise InvalidArgument(f"{field}: expected a non-negative integer or none", field=field)
        app = await self.application(name)
        params: dict[str, Any] = {"application_id": app["application_id"]}
        for field in fields:
            params[f"set_{field}"] = field in changes
            params[field] = changes.get(field)
        await self.db.execute("ops_app_patch_quota", params)
        return await self.application(name)

    async def set_weight(self, name: str, weight: Any) -> dict[str, Any]:
        """Set the application's fairness weight (1-100); returns the application. Every
        node applies it to its claim scheduler within about a second (``dispatch/weights.py``)."""
        weight = fairness_weight(weight)
        app = await self.application(name)
        await self.db.execute(
            "ops_app_set_weight", {"application_id": app["application_id"], "fairness_weight": weight}
        )
        return await self.application(name)

    async def set_submit_rate(self, name: str, per_second: int | None, burst: Any = UNCHANGED) -> dict[str, Any]:
        """Set the application's submit rate limit (tasks per second across the cluster, 0
        admits none; None: unlimited, which clears the burst too) and, when given, its burst
        (tasks at once, at least 1; None: one second of the rate); returns the application.
        Every node applies it within about a second (``admission/submit_rate.py``)."""
        if per_second is not None:
            per_second = rate_value(per_second, "submits_per_second", minimum=0)
        if burst is not UNCHANGED and burst is not None:
            burst = rate_value(burst, "burst", minimum=1)
        app = await self.application(name)
        await self.db.execute(
            "ops_app_set_submit_rate",
            {
                "application_id": app["application_id"],
                "submits_per_second": per_second,
                "set_submit_burst": burst is not UNCHANGED,
                "submit_burst": None if burst is UNCHANGED else burst,
            },
        )
        return await self.application(name)

    async def set_max_worker_connections(self, name: str, limit: Any) -> dict[str, Any]:
        """Set how many Worker connections of the application one node accepts at most (0
        refuses them all; None: no limit of its own); returns the application. A node reads
        it at each Worker handshake (with the credential), so it applies to the next
        connection; connections already open stay."""
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_WORKER_CONNECTIONS
        ):
            raise InvalidArgument(
                f"max_worker_connections: expected an integer from 0 to {MAX_WORKER_CONNECTIONS} or none, got {limit!r}",
                field="max_worker_connections",
            )
        app = await self.application(name)
        await self.db.execute(
            "ops_app_set_max_worker_connections",
            {"application_id": app["application_id"], "max_worker_connections": limit},
        )
        return await self.application(name)

    async def patch_retention(self, name: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Set the named retention fields (``succeeded``, ``failed``: a duration, or None for
        the node's default), keep the other; returns the application. The pruners of every
        node apply it at their next round."""
        unknown = set(changes) - {cls.option for cls in RetentionClass}
        if unknown:
            raise InvalidArgument(f"{sorted(unknown)[0]}: not a retention class", field=sorted(unknown)[0])
        if not changes:
            raise InvalidArgument("retention: name at least one of succeeded, failed", field="retention")
        seconds = {
            option: None if value is None else parse_duration(value, option) for option, value in changes.items()
        }
        app = await self.application(name)
        params: dict[str, Any] = {"application_id": app["application_id"]}
        for cls in RetentionClass:
            column = f"retain_{cls.option}_s"
            params[f"set_{column}"] = cls.option in seconds
            params[column] = seconds.get(cls.option)
        await self.db.execute("ops_app_patch_retention", params)
        return await self.application(name)

    async def namespace(self, application: str, namespace: str) -> dict[str, Any]:
        row = await self.db.fetchone("ops_namespace", {"application": application, "namespace": namespace})
        if row is None:
            await self.application(application)  # says which of the two is missing
            raise NotFound(f"namespace: {namespace!r} not found in application {application!r}", field="namespace")
        return row

    async def credentials(self, application: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Credentials of an application (or one namespace of it); never their secrets."""
        if namespace is None:
            await self.application(application)
        else:
            await self.namespace(application, namespace)
        rows = await self.db.fetchall("ops_credentials", {"application": application, "namespace": namespace})
        return [
            {
                "credential_id": r["credential_id"],
                "name": r["name"],
                "application": r["application"],
                "namespace": r["namespace"],
                "scopes": json.loads(r["scopes"]),
                "created_at": rfc3339(r["created_at"]),
                "revoked_at": rfc3339(r["revoked_at"]),
            }
            for r in rows
        ]

    # -- queues ------------------------------------------------------------------------

    async def queue_backlogs(
        self, *, application: str | None = None, namespace: str | None = None
    ) -> list[QueueBacklog]:
        if application is not None:
            if namespace is None:
                await self.application(application)
            else:
                await self.namespace(application, namespace)
        return await self._backlogs("ops_queues", {"application": application, "namespace": namespace})

    async def queue_of_id(self, queue_id: str) -> dict[str, Any]:
        """A queue of any namespace: its id, namespace id, name, namespace and application names."""
        row = await self.db.fetchone("ops_queue_of_id", {"queue_id": queue_id}) if is_hex32(queue_id) else None
        if row is None:
            raise NotFound(f"queue {queue_id} not found", field="queue")
        return row

    async def namespace_backlogs(self, namespace_id: str, queue_ids: Sequence[str] | None) -> list[QueueBacklog]:
        """The backlogs of one namespace's queues: all of them (None) or those of ``queue_ids``."""
        if queue_ids is not None and not queue_ids:
            return []
        return await self._backlogs(
            "ops_queues_of_namespace",
            {
                "namespace_id": namespace_id,
                "all_queues": queue_ids is None,
                # IN () is not valid SQL; the flag above makes this list irrelevant.
                "queue_ids": tuple(queue_ids) if queue_ids is not None else ("",),
            },
        )

    async def _backlogs(self, query: str, params: Mapping[str, Any]) -> list[QueueBacklog]:
        async def body(tx: Tx) -> list[QueueBacklog]:
            queues = await tx.fetchall(query, params)
            if not queues:
                return []
            ids = tuple(q["queue_id"] for q in queues)
            states: dict[str, dict[str, Any]] = {}
            for row in await tx.fetchall("ops_queue_states", {"queue_ids": ids}):
                counts = states.setdefault(row["queue_id"], {})
                counts[row["state"]] = int(row["n"])
                if row["state"] == "queued":
                    counts["due"] = int(row["due"] or 0)
                    if row["oldest_due_age_s"] is not None:
                        counts["oldest_due_age_s"] = float(row["oldest_due_age_s"])
            levels: dict[str, dict[int, int]] = {}
            step_us = PRIORITY_STEP_S * 1_000_000
            for row in await tx.fetchall("ops_queue_priorities", {"queue_ids": ids, "priority_step_us": step_us}):
                levels.setdefault(row["queue_id"], {})[int(row["level"])] = int(row["n"])
            return [
                QueueBacklog(
                    queue_id=q["queue_id"],
                    name=q["name"],
                    namespace=q["namespace"],
                    environment=q["environment"],
                    application=q["application"],
                    paused=bool(q["paused"]),
                    max_concurrency=q["max_concurrency"],
                    max_starts_per_second=q["max_starts_per_second"],
                    max_running_per_key=q["max_running_per_key"],
                    **{
                        k: v
                        for k, v in states.get(q["queue_id"], {}).items()
                        if k in ("queued", "due", "reserved", "running", "waiting", "oldest_due_age_s")
                    },
                    queued_by_priority=levels.get(q["queue_id"], {}),
                )
                for q in queues
            ]

        # One snapshot: the state counts and the priority counts agree with each other.
        return await self.db.transaction(body, isolation="REPEATABLE READ")

    # -- tasks -------------------------------------------------------------------------

    async def task(self, task_id: str, *, namespace_id: str | None = None) -> dict[str, Any]:
        """A task with its attempt history (no fencing tokens): of any namespace, or only of
        ``namespace_id`` (a task of another namespace is not found, like a missing one)."""
        if not is_hex32(task_id):
            raise NotFound(f"task {task_id} not found", field="task_id")

        async def body(tx: Tx) -> list[dict[str, Any]]:
            return await task_documents(tx, (task_id,), namespace_id=namespace_id)

        found = await self.db.transaction(body, isolation="REPEATABLE READ")
        if not found:
            raise NotFound(f"task {task_id} not found", field="task_id")
        return found[0]

    # -- Worker connections --------------------------------------------------------------

    async def namespace_workers(self, namespace_id: str) -> list[dict[str, Any]]:
        """Worker connections of one namespace registered by live nodes, with the tasks each holds."""
        rows = await self.db.fetchall(
            "ops_workers_of_namespace", {"namespace_id": namespace_id, "stale_s": NODE_STALE_S}
        )
        return [
            {
                "connection_id": r["connection_id"],
                "node_id": r["node_id"],
                "hostname": r["hostname"],
                "http_addr": r["http_addr"],
                "queues": _json_list(r["queues"]),
                "capabilities": _json_list(r["capabilities"]),
                "resource_key_support": bool(r["resource_key_support"]),
                "capacity": None if r["capacity"] is None else int(r["capacity"]),
                "client_name": r["client_name"],
                "client_version": r["client_version"],
                "connected_at": rfc3339(r["connected_at"]),
                "heartbeat_age_s": float(r["heartbeat_age_s"]),
                "held": int(r["held"]),
            }
            for r in rows
        ]


async def task_documents(
    tx: Tx,
    task_ids: Sequence[str],
    *,
    namespace_id: str | None = None,
    stored: Callable[[str | None], Any] = stored_json,
) -> list[dict[str, Any]]:
    """The tasks of ``task_ids`` found (of ``namespace_id`` only, unless None), each with its
    attempt history (no fencing tokens) and its parents (``depends_on``), in the order of
    ``task_ids``: three statements, one round trip. Times are RFC 3339; ``stored`` gives the value of each JSON text column
    (payload, result, errors)."""
    rows, attempts, edges = await tx.fetchall_each(
        tx.statement("ops_task", {"task_ids": tuple(task_ids), "namespace_id": namespace_id}),
        tx.statement("ops_task_attempts", {"task_ids": tuple(task_ids)}),
        tx.statement("dependency_parents_of", {"task_ids": tuple(task_ids)}),
    )
    # Each task's parents (depends_on, 000027) with their states (None: the parent is gone).
    parents = parents_by_child(edges)
    history: dict[str, list[dict[str, Any]]] = {}
    for row in attempts:
        attempt = _with_times(row)
        del attempt["task_id"]
        attempt["error"] = stored(row["error"])
        history.setdefault(row["task_id"], []).append(attempt)
    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        task = _with_times(row)
        task["cancel_requested"] = bool(row["cancel_requested"])
        task["payload"] = stored(row["payload"])
        task["result"] = stored(row["result"])
        task["error"] = stored(row["error"])
        task["attempt_history"] = history.get(row["task_id"], [])
        task["depends_on"] = parent_documents(parents.get(row["task_id"], {}))
        found[row["task_id"]] = task
    return [found[t] for t in task_ids if t in found]


def _with_times(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row with its times in RFC 3339."""
    return {key: rfc3339(value) if isinstance(value, datetime) else value for key, value in row.items()}


def _json_list(text: str) -> list[Any]:
    """A JSON list column of the registry; anything else reads as empty (it informs, never decides)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return []
    return value if isinstance(value, list) else []
