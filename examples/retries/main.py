"""Retries with backoff, and a permanent failure.

Run from the repository root, against a running node (``make run``):

    ORBIT_CREDENTIALS_FILE=var/dev.credentials.json .venv/bin/python examples/retries/main.py

It creates its own queue and submits two tasks, each allowed 3 attempts with a backoff of
1 s tripled per failure:

* ``flaky``: its handler raises ``ConnectionError`` (any exception is retryable) on its
  first two attempts and succeeds on the third;
* ``permanent``: its handler raises ``PermanentError``, which fails the task at once.

Expected output (the third line's waits are measured, so approximate; each is at least
the fixed half of its nominal backoff, 0.5 s then 1.5 s, or the example fails):

    flaky: outcomes=retry,retry,ok attempts=3 state=succeeded result={"charged": 42}
    permanent: outcomes=permanent attempts=1 state=failed error="PermanentError: card declined" code=CARD_DECLINED
    retry_waits_s~1.0,2.0

Bounded to 30 s; on any failure it prints one line on stderr and exits non-zero.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from orbit_sdk import Backoff, OrbitClient, PermanentError, SubmitTaskRequest, Worker, WorkerTask

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import main, run_id, serving  # noqa: E402

BACKOFF = Backoff(initial_ms=1000, multiplier=3.0, max_ms=10000)
MAX_ATTEMPTS = 3
# The attempts of the flaky handler that fail before one succeeds.
FAILING_ATTEMPTS = 2
# Half of each nominal delay is fixed, half is jitter (docs/dispatch.md): no retry
# comes sooner than this after the failure that caused it.
FIXED_SHARE = 0.5


async def scenario() -> tuple[list[str], bool]:
    run = run_id()
    handler = f"payment.charge.{run}"
    outcomes: dict[str, list[str]] = {"flaky": [], "permanent": []}
    failed_at: list[float] = []
    waits: list[float] = []

    async with OrbitClient.from_env() as client:
        queue = await client.create_queue(f"retries-example-{run}")
        worker = Worker.from_env(queues=[queue.queue_id], capacity=2, client_name="retries-example")

        @worker.handler(handler, "v1", "v1")
        async def charge(task: WorkerTask) -> dict[str, int]:
            kind = task.payload["kind"]
            if kind == "permanent":
                outcomes[kind].append("permanent")
                raise PermanentError("card declined", code="CARD_DECLINED")
            if failed_at:
                waits.append(trio.current_time() - failed_at[-1])
            if task.attempt <= FAILING_ATTEMPTS:
                outcomes[kind].append("retry")
                failed_at.append(trio.current_time())
                raise ConnectionError(f"payment service unreachable (attempt {task.attempt})")
            outcomes[kind].append("ok")
            return {"charged": 42}

        submitted = await client.submit_many(
            (
                f"retries-example-{run}-{kind}",
                SubmitTaskRequest(
                    queue_id=queue.queue_id,
                    handler=handler,
                    handler_version="v1",
                    payload_version="v1",
                    payload={"kind": kind},
                    max_attempts=MAX_ATTEMPTS,
                    backoff=BACKOFF,
                ),
            )
            for kind in outcomes
        )
        task_ids = dict(zip(outcomes, (item.task.task_id for item in submitted if item.task), strict=True))
        async with serving(worker):
            # Both tasks end: the flaky one after three attempts, the permanent one after one.
            await worker.wait_finished(len(outcomes))

        lines, ends = [], {}
        for kind, task_id in task_ids.items():
            task = await client.get_task(task_id)
            ends[kind] = (task.state, task.attempts)
            line = f"{kind}: outcomes={','.join(outcomes[kind])} attempts={task.attempts} state={task.state}"
            if task.state == "succeeded":
                line += f" result={json.dumps(task.result)}"
            else:
                line += f' error="{task.error["message"]}" code={task.error.get("code")}'
            lines.append(line)
        nominal = [BACKOFF.initial_ms / 1000 * BACKOFF.multiplier**n for n in range(FAILING_ATTEMPTS)]
        as_expected = (
            ends == {"flaky": ("succeeded", FAILING_ATTEMPTS + 1), "permanent": ("failed", 1)}
            and len(waits) == FAILING_ATTEMPTS
            and all(wait >= share * FIXED_SHARE for wait, share in zip(waits, nominal, strict=True))
        )
        lines.append("retry_waits_s~" + ",".join(f"{wait:.1f}" for wait in waits))
        return lines, as_expected


if __name__ == "__main__":
    sys.exit(main(scenario, limit_s=30))
