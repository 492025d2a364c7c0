"""A fan-out: 1,000 tasks submitted in one request, then waited for.

Run from the repository root, against a running node (``make run``):

    ORBIT_CREDENTIALS_FILE=var/dev.credentials.json .venv/bin/python examples/fanout/main.py

It creates its own queue, submits 1,000 tasks with ``OrbitClient.submit_many`` (one
``POST /v1/tasks/batch``: up to 1,000 tasks in one transaction, one result per task),
submits the same 1,000 again (each key is its task's acceptance key, so nothing new is
created), runs them with a capacity-64 Worker, waits until all have finished, and counts
the succeeded ones through ``GET /v1/tasks`` (pages of 500). Expected output (the
third line's times are measured: approximate, a few seconds on a laptop):

    submitted=1000 created=1000 resubmitted_created=0
    succeeded=1000 worker_completed=1000 worker_failed=0
    submit_s~0.4 run_s~1.5

Bounded to 120 s; on any failure it prints one line on stderr and exits non-zero.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from orbit_sdk import OrbitClient, SubmitTaskRequest, Worker, WorkerTask

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import main, run_id, serving  # noqa: E402

TASKS = 1000
CAPACITY = 64
PAGE = 500


async def scenario() -> tuple[list[str], bool]:
    run = run_id()
    handler = f"image.resize.{run}"

    async with OrbitClient.from_env() as client:
        queue = await client.create_queue(f"fanout-example-{run}")
        worker = Worker.from_env(queues=[queue.queue_id], capacity=CAPACITY, client_name="fanout-example")

        @worker.handler(handler, "v1", "v1")
        async def resize(task: WorkerTask) -> int:
            return int(task.payload["n"])

        requests = [
            (
                f"fanout-example-{run}-{n}",
                SubmitTaskRequest(
                    queue_id=queue.queue_id,
                    handler=handler,
                    handler_version="v1",
                    payload_version="v1",
                    payload={"n": n},
                ),
            )
            for n in range(TASKS)
        ]
        began = trio.current_time()
        results = await client.submit_many(requests)
        submitted = trio.current_time()
        again = await client.submit_many(requests)
        started = trio.current_time()
        async with serving(worker):
            await worker.wait_finished(TASKS)
        finished = trio.current_time()

        succeeded, cursor = 0, None
        while True:
            page = await client.list_tasks(queue_id=queue.queue_id, state="succeeded", limit=PAGE, cursor=cursor)
            succeeded += len(page.items)
            cursor = page.next_cursor
            if cursor is None:
                break

        created = sum(item.created for item in results)
        created_again = sum(item.created for item in again)
        lines = [
            f"submitted={len(results)} created={created} resubmitted_created={created_again}",
            f"succeeded={succeeded} worker_completed={worker.completed} worker_failed={worker.failed}",
            f"submit_s~{submitted - began:.1f} run_s~{finished - started:.1f}",
        ]
        as_expected = created == TASKS and created_again == 0 and succeeded == worker.completed == TASKS
        return lines, as_expected


if __name__ == "__main__":
    sys.exit(main(scenario, limit_s=120))
