"""Seeding for plan tests: definitions, plans through PlanStore, fire times put in the past
by writing ``plans.next_fire_at`` (never by waiting), and reads of what a plan created."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from orbit_node.db import Database
from orbit_node.domain.plans.definition import parse_definition
from orbit_node.store.plans import Plan, PlanStore

from .seed import Tenant

TASK = {"handler": "report.build", "handler_version": "v1", "payload_version": "v1", "payload": {"n": 10**30}}


def definition(*, priority: int | None = None, task: dict | None = None, **schedule: Any) -> dict[str, Any]:
    """A definition document; ``schedule`` values that are datetimes are written as RFC 3339."""
    body = dict(TASK if task is None else task)
    if priority is not None:
        body["priority"] = priority
    return {
        "task": body,
        "schedule": {k: (rfc3339(v) if isinstance(v, datetime) else v) for k, v in schedule.items()},
    }


def rfc3339(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def db_now(db: Database) -> datetime:
    return (await db.fetchone("db_now"))["now"]


async def whole_second(db: Database) -> datetime:
    """The database clock's current time, floored to the second."""
    return (await db_now(db)).replace(microsecond=0)


async def create_plan(db: Database, owner: Tenant, document: dict[str, Any] | None, name: str = "plan") -> Plan:
    parsed = None if document is None else parse_definition(document)
    return await PlanStore(db).create(owner.namespace_id, owner.queue_id, name, parsed)


async def set_next_fire(db: Database, plan_id: str, when: datetime | None) -> None:
    """Put the plan's next fire time where a test wants it (e.g. far in the past: an outage)."""
    await db.run(lambda tx: tx.execute_raw("UPDATE plans SET next_fire_at = %s WHERE plan_id = %s", (when, plan_id)))


async def plan_row(db: Database, plan_id: str) -> dict[str, Any]:
    rows = await db.run(lambda tx: tx.fetchall_raw("SELECT * FROM plans WHERE plan_id = %s", (plan_id,)))
    return rows[0]


async def plan_tasks(db: Database, plan_id: str) -> list[dict[str, Any]]:
    """Every task the plan created, in fire-time order, with the generated dispatch_at."""
    return await db.run(
        lambda tx: tx.fetchall_raw(
            "SELECT task_id, queue_id, application_id, priority, available_at, dispatch_at, plan_id, plan_version, "
            "handler, payload FROM tasks WHERE plan_id = %s ORDER BY available_at, task_id",
            (plan_id,),
        )
    )


async def fire_records(db: Database, namespace_id: str) -> list[dict[str, Any]]:
    return await db.run(
        lambda tx: tx.fetchall_raw(
            "SELECT idempotency_key, task_id FROM idempotency_records WHERE namespace_id = %s AND kind = 'plan' "
            "ORDER BY idempotency_key",
            (namespace_id,),
        )
    )


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)
