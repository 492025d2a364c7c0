"""A plan feeding a queue: an interval schedule creates tasks that a Worker runs.

Run from the repository root, against a running node (``make run``):

    ORBIT_CREDENTIALS_FILE=var/dev.credentials.json .venv/bin/python examples/plan/main.py

It creates its own queue and a plan in it that fires every second from ``start_at``
(the next whole second, plus 2 s) to ``end_at`` = ``start_at`` + 2 s, both inclusive:
exactly three fire times. Every node's plan trigger (once per second, on the database
clock) creates one task per fire time, its ``available_at`` the fire time; a
capacity-1 Worker runs them. A cron plan works the same way, with
``PlanSchedule(cron="*/5 * * * *", time_zone="Europe/Berlin")`` (at most one fire time
a minute, so too slow for an example). Expected output:

    plan: interval_s=1 fires=3 fire_offsets_s=0,1,2 next_fire_at=none
    tasks: states=succeeded,succeeded,succeeded ran_in_fire_order=true

Bounded to 30 s; on any failure it prints one line on stderr and exits non-zero.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

from orbit_sdk import OrbitClient, PlanDefinition, PlanSchedule, TaskTemplate, Worker, WorkerTask

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import main, run_id, serving  # noqa: E402

INTERVAL_S = 1
FIRES = 3
# The first fire time is this far beyond the next whole second: time to create the plan
# and start the Worker before it comes.
LEAD_S = 2


async def scenario() -> tuple[list[str], bool]:
    run = run_id()
    handler = f"report.build.{run}"
    ran: list[str] = []

    async with OrbitClient.from_env() as client:
        queue = await client.create_queue(f"plan-example-{run}")
        worker = Worker.from_env(queues=[queue.queue_id], capacity=1, client_name="plan-example")

        @worker.handler(handler, "v1", "v1")
        async def build(task: WorkerTask) -> dict[str, int]:
            ran.append(task.task_id)
            return {"report": task.payload["report"], "pages": 3}

        now = dt.datetime.now(dt.UTC)
        start = now.replace(microsecond=0) + dt.timedelta(seconds=1 + LEAD_S)
        end = start + dt.timedelta(seconds=INTERVAL_S * (FIRES - 1))
        plan = await client.create_plan(
            f"plan-example-{run}",
            queue.queue_id,
            PlanDefinition(
                task=TaskTemplate(
                    handler=handler, handler_version="v1", payload_version="v1", payload={"report": "daily"}
                ),
                schedule=PlanSchedule(interval_s=INTERVAL_S, start_at=start, end_at=end),
            ),
        )
        async with serving(worker):
            await worker.wait_completed(FIRES)

        plan = await client.get_plan(plan.plan_id)
        tasks = sorted((await client.list_plan_tasks(plan.plan_id)).items, key=lambda task: task.available_at)
        offsets = [(task.available_at - start).total_seconds() for task in tasks]
        states = [task.state for task in tasks]
        in_order = ran == [task.task_id for task in tasks]
        next_fire = "none" if plan.next_fire_at is None else plan.next_fire_at.isoformat()
        lines = [
            f"plan: interval_s={INTERVAL_S} fires={len(tasks)} fire_offsets_s={','.join(f'{offset:g}' for offset in offsets)} "
            f"next_fire_at={next_fire}",
            f"tasks: states={','.join(states)} ran_in_fire_order={'true' if in_order else 'false'}",
        ]
        as_expected = (
            offsets == list(range(FIRES)) and states == ["succeeded"] * FIRES and plan.next_fire_at is None and in_order
        )
        return lines, as_expected


if __name__ == "__main__":
    sys.exit(main(scenario, limit_s=30))
