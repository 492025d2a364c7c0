"""Resource keys: tasks that share a key never run at the same time.

Run from the repository root, against a running node (``make run``):

    ORBIT_CREDENTIALS_FILE=var/dev.credentials.json .venv/bin/python examples/resource_keys/main.py

It creates its own queue and submits 12 tasks, 4 for each of the resource keys
``account-a``, ``account-b`` and ``account-c`` (say, writes to one account that must
not overlap). A Worker of capacity 6 that declares ``resource_keys=True`` (only such a
Worker receives keyed tasks) runs them; each handler takes 0.1 s and records how many
tasks of its key run at that moment. The node reserves a keyed task only while no other
task holds the key, and releases the key when the task finishes. Expected output:

    tasks=12 keys=3 completed=12
    max_running_per_key=account-a:1,account-b:1,account-c:1

Bounded to 30 s; on any failure it prints one line on stderr and exits non-zero.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import trio

from orbit_sdk import OrbitClient, SubmitTaskRequest, Worker, WorkerTask

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import main, run_id, serving  # noqa: E402

KEYS = ("account-a", "account-b", "account-c")
PER_KEY = 4
CAPACITY = 6
HANDLER_S = 0.1


async def scenario() -> tuple[list[str], bool]:
    run = run_id()
    handler = f"account.update.{run}"
    running: Counter[str] = Counter()
    most: Counter[str] = Counter()

    async with OrbitClient.from_env() as client:
        queue = await client.create_queue(f"resource-keys-example-{run}")
        worker = Worker.from_env(
            queues=[queue.queue_id], capacity=CAPACITY, resource_keys=True, client_name="resource-keys-example"
        )

        @worker.handler(handler, "v1", "v1")
        async def update(task: WorkerTask) -> str:
            key = task.payload["account"]
            running[key] += 1
            most[key] = max(most[key], running[key])
            try:
                await trio.sleep(HANDLER_S)
            finally:
                running[key] -= 1
            return key

        # A run's keys are its own (a key is one per namespace), so runs never wait on each other.
        submitted = await client.submit_many(
            (
                f"resource-keys-example-{run}-{key}-{n}",
                SubmitTaskRequest(
                    queue_id=queue.queue_id,
                    handler=handler,
                    handler_version="v1",
                    payload_version="v1",
                    payload={"account": key},
                    resource_key=f"{key}-{run}",
                ),
            )
            for key in KEYS
            for n in range(PER_KEY)
        )
        async with serving(worker):
            await worker.wait_completed(len(submitted))

        lines = [
            f"tasks={len(submitted)} keys={len(KEYS)} completed={worker.completed}",
            "max_running_per_key=" + ",".join(f"{key}:{most[key]}" for key in KEYS),
        ]
        return lines, all(most[key] == 1 for key in KEYS) and worker.completed == len(KEYS) * PER_KEY


if __name__ == "__main__":
    sys.exit(main(scenario, limit_s=30))
