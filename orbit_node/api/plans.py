"""Routes of /v1/plans: plans, their immutable versions, activation, pause/resume, tasks.

Writing needs ``queues:manage`` for the plan's queue, reading ``tasks:read`` for it. A plan
of another namespace is 404 like an id that does not exist; a plan in a queue the
credential's grant does not cover is 403 (its namespace is the caller's own).
"""

from __future__ import annotations

import re
from typing import Any

from quart import Blueprint

from ..domain import rules
from ..domain.errors import InvalidArgument
from ..domain.plans.definition import parse_definition
from ..domain.strict_json import show
from ..domain.wire import rfc3339
from ..store.plans import Plan, PlanStore, PlanTask, PlanVersion
from ..store.tenancy import Principal
from . import envelope, validation
from .auth import require_any, shard
from .tasks import check_queue_filter, summary_json

bp = Blueprint("plans", __name__)

CREATE_FIELDS = ("name", "queue_id", "definition")
VERSION_FIELDS = ("definition",)
ACTIVATE_FIELDS = ("version",)
LIST_PARAMS = ("queue_id", "limit", "cursor")
VERSION_LIST_PARAMS = ("limit", "cursor")
TASK_LIST_PARAMS = ("state", "limit", "cursor")
# Cursor kinds: a cursor of one listing is refused by the others.
CURSOR_KIND = "p1"
VERSION_CURSOR_KIND = "pv1"
TASK_CURSOR_KIND = "pt1"
# plan_versions.version is an INT.
VERSION_MAX = 2_147_483_647
VERSION_TEXT = re.compile(r"[1-9][0-9]{0,9}")
# Plan names follow the queue name rule.
NAME_RULE = "1-128 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"


def plan_json(plan: Plan) -> dict[str, Any]:
    return {
        "plan_id": plan.plan_id,
        "name": plan.name,
        "queue_id": plan.queue_id,
        "paused": plan.paused,
        "active_version": plan.active_version,
        "next_fire_at": rfc3339(plan.next_fire_at),
        "last_fire_at": rfc3339(plan.last_fire_at),
        "created_at": rfc3339(plan.created_at),
        "updated_at": rfc3339(plan.updated_at),
    }


def version_json(version: PlanVersion) -> dict[str, Any]:
    return {
        "plan_id": version.plan_id,
        "version": version.version,
        "definition": version.definition,
        "created_at": rfc3339(version.created_at),
    }


def plan_task_json(task: PlanTask) -> dict[str, Any]:
    return {**summary_json(task), "plan_version": task.plan_version}


def _store() -> PlanStore:
    return shard().plans


async def _plan(plan_id: str, scope: str) -> tuple[Principal, Plan]:
    """The plan of the path, after checking ``scope`` for its queue."""
    who = require_any(scope)
    plan = await _store().get(who.namespace_id, rules.path_id(plan_id, "plan_id"))
    who.require(scope, plan.queue_id)
    return who, plan


def _path_version(text: str) -> int:
    """The version number of a path segment."""
    if not VERSION_TEXT.fullmatch(text) or int(text) > VERSION_MAX:
        raise InvalidArgument(f"version: must be an integer from 1 to {VERSION_MAX}, got {show(text)}", field="version")
    return int(text)


@bp.post("/plans")
async def create_plan():
    who = require_any("queues:manage")
    body = await validation.json_object(required=True)
    rules.reject_unknown(body, CREATE_FIELDS)
    name = rules.string(rules.require(body, "name"), "name", rules.QUEUE_NAME, NAME_RULE)
    queue_id = rules.string(rules.require(body, "queue_id"), "queue_id", rules.QUEUE_ID, "32 lowercase hex characters")
    definition = parse_definition(body["definition"]) if "definition" in body else None
    who.require("queues:manage", queue_id)
    plan = await _store().create(who.namespace_id, queue_id, name, definition)
    return envelope.ok(plan_json(plan), 201)


@bp.get("/plans")
async def list_plans():
    who = require_any("tasks:read")
    params = validation.query(LIST_PARAMS)
    queue_id = params.get("queue_id")
    after = validation.decode_cursor(CURSOR_KIND, params)
    limit = validation.limit(params)
    await check_queue_filter(who, queue_id)
    plans = await _store().list(
        who.namespace_id,
        queue_ids=who.queue_filter("tasks:read"),
        queue_id=queue_id,
        after=after or "",
        limit=limit + 1,
    )
    last = plans[limit - 1].plan_id if len(plans) > limit else None
    return envelope.ok([plan_json(p) for p in plans[:limit]], next_cursor=validation.encode_cursor(CURSOR_KIND, last))


@bp.get("/plans/<plan_id>")
async def get_plan(plan_id: str):
    _, plan = await _plan(plan_id, "tasks:read")
    return envelope.ok(plan_json(plan))


@bp.post("/plans/<plan_id>/versions")
async def add_plan_version(plan_id: str):
    who, plan = await _plan(plan_id, "queues:manage")
    body = await validation.json_object(required=True)
    rules.reject_unknown(body, VERSION_FIELDS)
    definition = parse_definition(rules.require(body, "definition"))
    version = await _store().add_version(who.namespace_id, plan.plan_id, definition)
    return envelope.ok(version_json(version), 201)


@bp.get("/plans/<plan_id>/versions")
async def list_plan_versions(plan_id: str):
    who, plan = await _plan(plan_id, "tasks:read")
    params = validation.query(VERSION_LIST_PARAMS)
    after = validation.decode_cursor(VERSION_CURSOR_KIND, params)
    limit = validation.limit(params)
    versions = await _store().list_versions(
        who.namespace_id, plan.plan_id, after=int(after, 16) if after else 0, limit=limit + 1
    )
    last = f"{versions[limit - 1].version:032x}" if len(versions) > limit else None
    return envelope.ok(
        [version_json(v) for v in versions[:limit]], next_cursor=validation.encode_cursor(VERSION_CURSOR_KIND, last)
    )


@bp.get("/plans/<plan_id>/versions/<version>")
async def get_plan_version(plan_id: str, version: str):
    who, plan = await _plan(plan_id, "tasks:read")
    found = await _store().get_version(who.namespace_id, plan.plan_id, _path_version(version))
    return envelope.ok(version_json(found))


@bp.post("/plans/<plan_id>/activate")
async def activate_plan_version(plan_id: str):
    who, plan = await _plan(plan_id, "queues:manage")
    body = await validation.json_object(required=True)
    rules.reject_unknown(body, ACTIVATE_FIELDS)
    version = rules.integer(rules.require(body, "version"), "version", 1, VERSION_MAX)
    return envelope.ok(plan_json(await _store().activate(who.namespace_id, plan.plan_id, version)))


@bp.post("/plans/<plan_id>/pause")
async def pause_plan(plan_id: str):
    who, plan = await _plan(plan_id, "queues:manage")
    rules.no_fields(await validation.json_object(required=False))
    return envelope.ok(plan_json(await _store().set_paused(who.namespace_id, plan.plan_id, True)))


@bp.post("/plans/<plan_id>/resume")
async def resume_plan(plan_id: str):
    who, plan = await _plan(plan_id, "queues:manage")
    rules.no_fields(await validation.json_object(required=False))
    return envelope.ok(plan_json(await _store().set_paused(who.namespace_id, plan.plan_id, False)))


@bp.get("/plans/<plan_id>/tasks")
async def list_plan_tasks(plan_id: str):
    who, plan = await _plan(plan_id, "tasks:read")
    params = validation.query(TASK_LIST_PARAMS)
    state = validation.state(params)
    before = validation.decode_cursor(TASK_CURSOR_KIND, params)
    limit = validation.limit(params)
    page = await _store().list_tasks(who.namespace_id, plan.plan_id, state=state, before=before, limit=limit)
    return envelope.ok(
        [plan_task_json(t) for t in page.tasks], next_cursor=validation.encode_cursor(TASK_CURSOR_KIND, page.last)
    )
