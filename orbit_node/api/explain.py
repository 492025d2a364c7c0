"""GET /v1/tasks/{task_id}/explain: why a task is (not) being dispatched right now.

Register ``blueprint`` inside the authenticated /v1 blueprint
(``v1.register_blueprint(explain.blueprint)``): its routes are relative to /v1 and rely
on ``g.principal`` being set by the /v1 authentication. Scope: ``tasks:read`` for the
task's queue. Unknown tasks and tasks of another namespace are 404 ``NOT_FOUND``.
"""

from __future__ import annotations

from quart import Blueprint

from ..domain import rules
from . import envelope
from .auth import require_any, shard

blueprint = Blueprint("explain", __name__)


@blueprint.get("/tasks/<task_id>/explain")
async def explain_task(task_id: str):
    who = require_any("tasks:read")
    explanation = await shard().leases.explain(who.namespace_id, rules.path_id(task_id, "task_id"))
    who.require("tasks:read", explanation["queue_id"])
    return envelope.ok(explanation)
