"""Seeding for dispatch tests: tenants through TenancyStore, task rows with raw SQL.

Task times are written relative to the database clock in ONE statement per batch
(``NOW(6)`` is constant within a statement), so rows written together share an exact
reference time: "due 270 s ago" and "just due" tie to the microsecond when they must.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from orbit_node.db import Database
from orbit_node.domain.claims import Capability, ClaimRequest
from orbit_node.domain.ids import time_ordered_id
from orbit_node.store.leases import LeaseStore
from orbit_node.store.tenancy import TenancyStore

CAP = Capability("h", "v1", "v1")
NODE = "0" * 32


@attrs.frozen
class Tenant:
    application_id: str
    namespace_id: str
    queue_id: str


async def tenant(
    db: Database,
    *,
    application: str = "app",
    namespace: str = "default",
    queue: str = "q",
    max_concurrency: int | None = None,
    max_starts_per_second: int | None = None,
    max_running_per_key: int = 1,
) -> Tenant:
    store = TenancyStore(db)
    app = await store.ensure_application(application)
    ns = await store.ensure_namespace(app["application_id"], namespace, "test")
    q, _ = await store.create_queue(
        ns["namespace_id"],
        app["application_id"],
        queue,
        max_concurrency=max_concurrency,
        max_starts_per_second=max_starts_per_second,
        max_running_per_key=max_running_per_key,
        exist_ok=True,
    )
    return Tenant(app["application_id"], ns["namespace_id"], q.queue_id)


async def add_queue(db: Database, owner: Tenant, name: str, **controls: Any) -> Tenant:
    q, _ = await TenancyStore(db).create_queue(owner.namespace_id, owner.application_id, name, **controls)
    return attrs.evolve(owner, queue_id=q.queue_id)


@attrs.frozen(kw_only=True)
class TaskSpec:
    # Seconds from the database's NOW(6): negative = due that long ago.
    available_in_s: float = 0.0
    priority: int = 0
    handler: str = "h"
    handler_version: str = "v1"
    payload_version: str = "v1"
    payload: str = "{}"
    deadline_in_s: float | None = None
    attempts: int = 0
    max_attempts: int = 3
    resource_key: str | None = None
    cancel_requested: bool = False
    backoff_initial_ms: int = 1000
    backoff_max_ms: int = 300000
    backoff_multiplier: float = 2.0
    task_id: str | None = None


def _micros(seconds: float) -> int:
    return int(round(seconds * 1_000_000))


async def insert_tasks(db: Database, owner: Tenant, specs: Sequence[TaskSpec]) -> list[str]:
    """Insert task rows in one statement; returns their ids in the order given."""
    ids = [s.task_id or time_ordered_id() for s in specs]
    rows_sql, params = [], []
    for task_id, s in zip(ids, specs, strict=True):
        deadline_sql = "NULL" if s.deadline_in_s is None else "NOW(6) + INTERVAL %s MICROSECOND"
        rows_sql.append(
            "(%s, %s, %s, %s, %s, %s, %s, %s, NOW(6) + INTERVAL %s MICROSECOND, "
            f"{deadline_sql}, %s, %s, %s, %s, %s, %s, %s, %s)"
        )
        params += [
            task_id,
            owner.application_id,
            owner.namespace_id,
            owner.queue_id,
            s.handler,
            s.handler_version,
            s.payload_version,
            s.payload,
            _micros(s.available_in_s),
        ]
        if s.deadline_in_s is not None:
            params.append(_micros(s.deadline_in_s))
        params += [
            s.attempts,
            s.max_attempts,
            s.resource_key,
            int(s.cancel_requested),
            s.priority,
            s.backoff_initial_ms,
            s.backoff_max_ms,
            s.backoff_multiplier,
        ]
    sql = (
        "INSERT INTO tasks (task_id, application_id, namespace_id, queue_id, handler, handler_version, "
        "payload_version, payload, available_at, deadline, attempts, max_attempts, resource_key, "
        "cancel_requested, priority, backoff_initial_ms, backoff_max_ms, backoff_multiplier) VALUES "
        + ", ".join(rows_sql)
    )
    keys = sorted({s.resource_key for s in specs if s.resource_key is not None})

    async def body(tx):
        await tx.execute_raw(sql, params)
        for key in keys:
            # As the task submit does: the occupancy row exists from the first task naming the key.
            await tx.execute_raw(
                "INSERT IGNORE INTO resource_keys (namespace_id, resource_key) VALUES (%s, %s)",
                (owner.namespace_id, key),
            )

    await db.transaction(body)
    return ids


async def insert_task(db: Database, owner: Tenant, **spec: Any) -> str:
    return (await insert_tasks(db, owner, [TaskSpec(**spec)]))[0]


async def bulk_insert_tasks(
    db: Database,
    owner: Tenant,
    count: int,
    *,
    id_prefix: str,
    available_in_s: float = 0.0,
    spread_s: float = 0.0,
    priority: int = 0,
    handler: str = "h",
) -> None:
    """Insert ``count`` tasks with one INSERT ... SELECT over a cross join of digits.

    Ids are ``id_prefix`` (8 hex) + a 24-hex sequence number. With ``spread_s``, task n
    becomes available ``n * spread_s`` seconds after ``available_in_s``.
    """
    assert len(id_prefix) == 8
    digits = max(1, math.ceil(math.log10(count))) if count > 1 else 1
    tables = ", ".join(
        f"(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL "
        f"SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL "
        f"SELECT 8 UNION ALL SELECT 9) d{i}"
        for i in range(digits)
    )
    number = " + ".join(f"d{i}.d * {10**i}" for i in range(digits))
    sql = (
        "INSERT INTO tasks (task_id, application_id, namespace_id, queue_id, handler, handler_version, "
        "payload_version, payload, available_at, priority) "
        f"SELECT CONCAT(%s, LPAD(LOWER(HEX(n)), 24, '0')), %s, %s, %s, %s, 'v1', 'v1', '{{}}', "
        "NOW(6) + INTERVAL (%s + n * %s) MICROSECOND, %s "
        f"FROM (SELECT {number} AS n FROM {tables}) seq WHERE n < %s"
    )
    params = (
        id_prefix,
        owner.application_id,
        owner.namespace_id,
        owner.queue_id,
        handler,
        _micros(available_in_s),
        _micros(spread_s),
        priority,
        count,
    )
    await db.run(lambda tx: tx.execute_raw(sql, params))


def claim_request(
    owner: Tenant,
    *,
    limit: int = 16,
    capabilities: Sequence[Capability] = (CAP,),
    resource_key_support: bool = False,
    queue_ids: Sequence[str] | None = None,
    connection_id: str = "conn-1",
    node_id: str = NODE,
) -> ClaimRequest:
    return ClaimRequest(
        namespace_id=owner.namespace_id,
        application_id=owner.application_id,
        queue_ids=tuple(queue_ids or (owner.queue_id,)),
        capabilities=frozenset(capabilities),
        resource_key_support=resource_key_support,
        limit=limit,
        node_id=node_id,
        connection_id=connection_id,
    )


def lease_store(db: Database, **overrides: Any) -> LeaseStore:
    options = {"reservation_lease_s": 30.0, "run_lease_s": 60.0, "batch_size": 16, **overrides}
    return LeaseStore(db, **options)


async def task_row(db: Database, task_id: str) -> dict[str, Any]:
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT * FROM tasks WHERE task_id = %s", (task_id,)))
    assert rows, f"task {task_id} missing"
    return rows[0]


async def attempt_rows(db: Database, task_id: str) -> list[dict[str, Any]]:
    return await db.run(
        lambda tx: tx.fetchall_raw("SELECT * FROM task_attempts WHERE task_id = %s ORDER BY attempt_id", (task_id,))
    )


async def count_states(db: Database) -> dict[str, int]:
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT state, COUNT(*) AS n FROM tasks GROUP BY state"))
    return {r["state"]: r["n"] for r in rows}


async def expire_lease(db: Database, task_id: str, *, seconds_ago: float = 1.0) -> None:
    """Move a lease into the past on the database clock (instead of waiting for it)."""
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE tasks SET lease_expires_at = NOW(6) - INTERVAL %s MICROSECOND WHERE task_id = %s",
            (_micros(seconds_ago), task_id),
        )
    )
