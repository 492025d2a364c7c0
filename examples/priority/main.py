"""Priorities: three tasks submitted as 0, 9, 4 run as 9, 4, 0 (a higher priority runs first).

Run from the repository root, against a running node (``make run``):

    ORBIT_CREDENTIALS_FILE=var/dev.credentials.json .venv/bin/python examples/priority/main.py

It creates its own queue and handler name, submits three tasks (each with a 20 s
deadline), then starts a capacity-1 automatic Worker whose handler returns its input
(exact big integers included). Expected output:

    submitted_priorities=0,9,4 executed_priorities=9,4,0
    completed=3 attempts_per_task=1 worker_drained=true

The whole scenario is bounded to 25 s; on any failure it drains the Worker (bounded),
prints one line on stderr and exits non-zero. History is kept.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

from orbit_sdk import OrbitClient, SubmitTaskRequest, Worker, WorkerTask

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import ScenarioFailed, main, run_id, serving  # noqa: E402

SUBMITTED = (0, 9, 4)
# Deadline of each task, and the bound on the whole scenario.
TASK_DEADLINE_S = 20
SCENARIO_LIMIT_S = 25
# A payload integer far beyond 64 bits: it must come back exactly.
BIG = 2**100 + 7


async def scenario() -> tuple[list[str], bool]:
    run = run_id()
    handler = f"object.prepare.{run}"
    async with OrbitClient.from_env() as client:
        queue = await client.create_queue(f"priority-example-{run}")
        deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=TASK_DEADLINE_S)
        payloads, task_ids = {}, []
        for index, priority in enumerate(SUBMITTED):
            payload = {"object_ref": "objects/example", "operation_ref": f"prepare-{index:03d}", "exact": BIG + index}
            accepted = await client.submit_task(
                f"priority-example-{run}-{index}",
                SubmitTaskRequest(
                    queue_id=queue.queue_id,
                    handler=handler,
                    handler_version="v1",
                    payload_version="v1",
                    payload=payload,
                    priority=priority,
                    deadline=deadline,
                ),
            )
            payloads[accepted.task.task_id] = payload
            task_ids.append(accepted.task.task_id)

        executed: list[int] = []
        worker = Worker.from_env(queues=[queue.queue_id], capacity=1, client_name="priority-example")

        @worker.handler(handler, "v1", "v1")
        async def prepare(task: WorkerTask) -> object:
            executed.append(task.priority)
            return task.payload

        async with serving(worker):
            await worker.wait_completed(len(SUBMITTED))

        attempts = set()
        for task_id in task_ids:
            task = await client.get_task(task_id)
            if task.state != "succeeded" or task.result != payloads[task_id]:
                raise ScenarioFailed(f"task {task_id} ended {task.state} with result {task.result!r}")
            attempts.add(task.attempts)
    per_task = ",".join(str(a) for a in sorted(attempts))
    lines = [
        f"submitted_priorities={','.join(map(str, SUBMITTED))} executed_priorities={','.join(map(str, executed))}",
        f"completed={worker.completed} attempts_per_task={per_task} worker_drained={'true' if worker.drained else 'false'}",
    ]
    return lines, executed == [9, 4, 0] and worker.completed == 3 and attempts == {1} and worker.drained


if __name__ == "__main__":
    sys.exit(main(scenario, limit_s=SCENARIO_LIMIT_S))
