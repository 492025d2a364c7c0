"""The SDK's plan methods against a real node whose plan trigger runs: create, version,
activate, pause, resume, list, and the tasks the trigger created with the version's priority."""

from __future__ import annotations

from datetime import UTC

import pytest
import trio

from orbit_node.services import ServiceSet
from orbit_sdk import (
    InvalidArgumentError,
    NotFoundError,
    OrbitClient,
    PlanDefinition,
    PlanSchedule,
    PlanTaskSummary,
    TaskTemplate,
)

from ..nodeutil import make_tenant, run_node
from ..plans_seed import seconds, set_next_fire, whole_second

TIMEOUT_S = 60


def template(priority: int) -> TaskTemplate:
    return TaskTemplate(
        handler="report.build", handler_version="v1", payload_version="v1", payload={"big": 2**80}, priority=priority
    )


async def test_the_sdk_manages_a_plan_whose_tasks_a_running_node_creates(node_config, db):
    tenant = await make_tenant(db)
    t0 = await whole_second(db) - seconds(60)
    with trio.fail_after(TIMEOUT_S):
        async with run_node(node_config, services=ServiceSet(plans=True)) as running:
            async with OrbitClient(running.base_url, tenant.token) as client:
                # Ten fire times, one a second, all before now: the plan has nothing left to
                # fire until the test writes next_fire_at back to the first one.
                schedule = PlanSchedule(
                    interval_s=1,
                    start_at=t0.replace(tzinfo=UTC),
                    end_at=(t0 + seconds(9)).replace(tzinfo=UTC),
                    grace_s=3600,
                )
                plan = await client.create_plan(
                    "reports", tenant.queue_id, PlanDefinition(task=template(7), schedule=schedule)
                )
                assert (plan.active_version, plan.next_fire_at, plan.paused) == (1, None, False)
                await set_next_fire(db, plan.plan_id, t0)
                trigger = running.node.state.services.shards.main.trigger
                while trigger.totals.tasks_created < 10:
                    await trigger.wait_for_pass()

                page = await client.list_plan_tasks(plan.plan_id, limit=4)
                tasks = list(page.items)
                while page.next_cursor is not None:
                    page = await client.list_plan_tasks(plan.plan_id, limit=4, cursor=page.next_cursor)
                    tasks += page.items
                assert all(isinstance(t, PlanTaskSummary) for t in tasks)
                assert sorted(t.available_at for t in tasks) == [
                    (t0 + seconds(k)).replace(tzinfo=UTC) for k in range(10)
                ]
                assert {(t.priority, t.plan_version, t.state) for t in tasks} == {(7, 1, "queued")}
                detail = await client.get_task(tasks[0].task_id)
                assert (detail.plan_id, detail.plan_version, detail.payload) == (plan.plan_id, 1, {"big": 2**80})

                # A change is a new version; it takes effect once activated.
                v2 = await client.add_plan_version(
                    plan.plan_id, PlanDefinition(task=template(2), schedule=PlanSchedule(cron="0 3 * * *"))
                )
                assert v2.version == 2 and v2.definition["task"]["priority"] == 2
                assert (await client.get_plan(plan.plan_id)).active_version == 1
                activated = await client.activate_plan_version(plan.plan_id, 2)
                assert activated.active_version == 2
                assert (activated.next_fire_at.hour, activated.next_fire_at.minute) == (3, 0)
                versions = await client.list_plan_versions(plan.plan_id)
                assert [v.version for v in versions.items] == [1, 2]
                assert (await client.get_plan_version(plan.plan_id, 1)).definition["task"]["priority"] == 7
                # The tasks version 1 created keep its priority.
                assert {t.priority for t in (await client.list_plan_tasks(plan.plan_id)).items} == {7}

                paused = await client.pause_plan(plan.plan_id)
                assert (paused.paused, paused.next_fire_at) == (True, None)
                resumed = await client.resume_plan(plan.plan_id)
                assert (resumed.paused, resumed.next_fire_at) == (False, activated.next_fire_at)
                listed = await client.list_plans(queue_id=tenant.queue_id)
                assert [p.plan_id for p in listed.items] == [plan.plan_id] and listed.next_cursor is None

                with pytest.raises(InvalidArgumentError) as refused:
                    await client.add_plan_version(
                        plan.plan_id,
                        {"task": {**template(0).to_json(), "priority": 9.0}, "schedule": {"interval_s": 60}},
                    )
                assert refused.value.field == "definition.task.priority"
                with pytest.raises(NotFoundError) as missing:
                    await client.activate_plan_version(plan.plan_id, 3)
                assert missing.value.field == "version"
                assert [v.version for v in (await client.list_plan_versions(plan.plan_id)).items] == [1, 2]
