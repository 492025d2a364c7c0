"""Priority example (P3 section 4): three tasks submitted as 0, 9, 4 run as 9, 4, 0.

Run from the repository root inside .venv, against a running node:

    ORBIT_URL=http://127.0.0.1:8080 ORBIT_CREDENTIALS_FILE=var/dev.credentials.json \\
        python examples/priority/main.py

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
import os
import secrets
import sys

import trio

from orbit_node.sdk.client import Credentials, OrbitClient, SubmitTaskRequest
from orbit_node.sdk.worker import Worker, WorkerTask

SUBMITTED = (0, 9, 4)
# Deadline of each task, and the bound on the whole scenario.
TASK_DEADLINE_S = 20
SCENARIO_LIMIT_S = 25
# Bound on the clean-up after a failure.
CLEANUP_S = 3
# A payload integer far beyond 64 bits: it must come back exactly.
BIG = 2**100 + 7


class ScenarioFailed(Exception):
    pass


async def scenario() -> tuple[list[int], int, set[int], bool]:
    run = secrets.token_hex(4)
    handler = f"object.prepare.{run}"
    credentials = Credentials.load(os.environ["ORBIT_CREDENTIALS_FILE"])
    url = os.environ.get("ORBIT_URL") or credentials.url
    async with OrbitClient.from_credentials(credentials, url=url) as client:
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
        worker = Worker(
            url=url, token=credentials.token, queues=[queue.queue_id], capacity=1, client_name="priority-example"
        )

        async def prepare(task: WorkerTask):
            executed.append(task.priority)
            return task.payload

        worker.register(handler, "v1", "v1", prepare)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            try:
                await worker.wait_completed(len(SUBMITTED))
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_S):
                    await worker.drain()
                nursery.cancel_scope.cancel()

        attempts = set()
        for task_id in task_ids:
            task = await client.get_task(task_id)
            if task.state != "succeeded" or task.result != payloads[task_id]:
                raise ScenarioFailed(f"task {task_id} ended {task.state} with result {task.result!r}")
            attempts.add(task.attempts)
        return executed, worker.completed, attempts, worker.drained


async def main() -> int:
    try:
        with trio.fail_after(SCENARIO_LIMIT_S):
            executed, completed, attempts, drained = await scenario()
    except KeyError as exc:
        print(f"error: {exc.args[0]} is not set", file=sys.stderr)
        return 1
    except trio.TooSlowError:
        print(f"error: the scenario did not finish within {SCENARIO_LIMIT_S} s", file=sys.stderr)
        return 1
    except Exception as exc:  # one line, never a traceback
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"submitted_priorities={','.join(map(str, SUBMITTED))} executed_priorities={','.join(map(str, executed))}")
    per_task = ",".join(str(a) for a in sorted(attempts))
    print(f"completed={completed} attempts_per_task={per_task} worker_drained={'true' if drained else 'false'}")
    return 0 if executed == [9, 4, 0] and completed == 3 and attempts == {1} and drained else 1


if __name__ == "__main__":
    sys.exit(trio.run(main))
