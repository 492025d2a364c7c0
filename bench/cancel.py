"""Cancel: POST /v1/tasks/{id}/cancel -> the running handler sees trio.Cancelled.

Two real node processes (``bench.nodeproc``) on one database. An SDK Worker (in this
process) holds its connection to node A and runs ``--cancel-tasks`` handlers that wait
until cancelled. Each task is then cancelled, at a random moment within a spread,

* through node A, the node that holds the Worker's connection: the node pushes the
  cancel to the Worker at once (target: under 1 s);
* through node B, which does not hold it: node A learns it at the Worker's next lease
  renewal, every third of the run lease (target: within one renew interval; the spread
  is one interval, so the cancels land at every phase of it).

Latency per task: from sending the POST to the handler catching ``trio.Cancelled``
(one clock, this process's). Every task must end ``cancelled``.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import attrs
import trio

from orbit_sdk import OrbitClient, SubmitTaskRequest, Worker, WorkerTask

from .clients import wait_until
from .database import bench_database, make_app
from .processes import node_process
from .report import Target, format_table, ms, summarize

HANDLER = ("bench.block", "v1", "v1")
# The target through the node that holds the Worker's connection.
TARGET_SAME_NODE_S = 1.0
# Through another node: one renew interval, plus the renew's own round trip (the Worker
# sleeps one interval between renewals, so a full period is a little longer).
RENEW_ROUND_TRIP_S = 0.1
# Cancels through the holding node land within this many seconds (random moments).
SAME_NODE_SPREAD_S = 1.0
# Bound on the handlers starting, and on the tasks settling after their cancel.
SETTLE_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cancel-tasks", type=int, default=50, help="tasks cancelled per path (default 50)")
    parser.add_argument(
        "--cancel-run-lease-s",
        type=float,
        default=60.0,
        help="run lease of both nodes; the Worker renews every third of it (default 60, the node's)",
    )


@attrs.define(eq=False)
class Blocking:
    """A handler that waits until it is cancelled; when each task started and saw the cancel."""

    started: set[str] = attrs.field(factory=set)
    cancelled_at: dict[str, float] = attrs.field(factory=dict)
    seen: dict[str, trio.Event] = attrs.field(factory=dict)

    def expect(self, task_id: str) -> trio.Event:
        return self.seen.setdefault(task_id, trio.Event())

    async def __call__(self, task: WorkerTask) -> None:
        self.started.add(task.task_id)
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled_at[task.task_id] = time.perf_counter()
            self.expect(task.task_id).set()
            raise


async def cancel_path(
    submitter: OrbitClient, canceller: OrbitClient, worker: Worker, handler: Blocking, app, tasks: int, spread_s: float
) -> dict[str, Any]:
    """Run ``tasks`` handlers, cancel each through ``canceller`` within ``spread_s``."""
    run = f"{time.time_ns()}"
    results = await submitter.submit_many(
        (
            f"cancel-{run}-{index}",
            SubmitTaskRequest(
                queue_id=app.queue_id,
                handler=HANDLER[0],
                handler_version=HANDLER[1],
                payload_version=HANDLER[2],
                payload={},
            ),
        )
        for index in range(tasks)
    )
    task_ids = [item.task.task_id for item in results if item.task is not None]
    if not await wait_until(lambda: handler.started >= set(task_ids), timeout_s=SETTLE_S):
        raise RuntimeError(f"only {len(handler.started & set(task_ids))} of {len(task_ids)} handlers started")
    finished_before = worker.finished
    latencies: list[float] = []
    answers: list[float] = []

    async def cancel(task_id: str) -> None:
        await trio.sleep(random.uniform(0.0, spread_s))
        seen = handler.expect(task_id)
        sent = time.perf_counter()
        answered = await canceller.cancel_task(task_id)
        answers.append(time.perf_counter() - sent)
        if not answered.cancel_requested:
            raise RuntimeError(f"task {task_id}: cancel not recorded ({answered.state})")
        await seen.wait()
        latencies.append(handler.cancelled_at[task_id] - sent)

    with trio.fail_after(spread_s + SETTLE_S):
        async with trio.open_nursery() as nursery:
            for task_id in task_ids:
                nursery.start_soon(cancel, task_id)
        await worker.wait_finished(finished_before + len(task_ids))
    states = {(await submitter.get_task(task_id)).state for task_id in task_ids}
    if states != {"cancelled"}:
        raise RuntimeError(f"cancelled tasks ended {sorted(states)}")
    return {
        "tasks": len(task_ids),
        "latency_s": summarize(latencies),
        "cancel_answer_s": summarize(answers),
        "samples_s": latencies,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.cancel_tasks < 1:
        raise SystemExit("--cancel-tasks: at least 1")
    renew_s = args.cancel_run_lease_s / 3
    handler = Blocking()
    rows: list[dict[str, Any]] = []
    async with bench_database() as bdb:
        app = await make_app(bdb.db, "cancel")
        async with (
            node_process(bdb.dsn, run_lease_s=args.cancel_run_lease_s) as holding,
            node_process(bdb.dsn, run_lease_s=args.cancel_run_lease_s) as other,
            OrbitClient(holding.url, app.token) as via_holding,
            OrbitClient(other.url, app.token) as via_other,
        ):
            worker = Worker(holding.url, app.token, [app.queue_id], capacity=args.cancel_tasks, client_name="bench")
            worker.register(*HANDLER, handler)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                try:
                    for path, canceller, spread_s in (
                        ("same node (holds the connection)", via_holding, SAME_NODE_SPREAD_S),
                        ("another node", via_other, renew_s),
                    ):
                        row = await cancel_path(
                            via_holding, canceller, worker, handler, app, args.cancel_tasks, spread_s
                        )
                        rows.append({"path": path, "spread_s": spread_s, **row})
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(10):
                        await worker.drain()
                    nursery.cancel_scope.cancel()
    same, remote = rows
    table = format_table(
        ["cancel through", "tasks", "p50 ms", "p99 ms", "max ms", "POST answered p50 ms", "target"],
        [
            [
                r["path"],
                r["tasks"],
                ms(r["latency_s"]["p50"]),
                ms(r["latency_s"]["p99"]),
                ms(r["latency_s"]["max"]),
                ms(r["cancel_answer_s"]["p50"]),
                target,
            ]
            for r, target in ((same, f"< {TARGET_SAME_NODE_S:g} s"), (remote, f"<= renew interval ({renew_s:g} s)"))
        ],
        align="lrrrrrl",
    )
    targets = [
        Target.at_most("cancel -> handler, same node, max", same["latency_s"]["max"], TARGET_SAME_NODE_S, unit=" s"),
        Target.at_most(
            "cancel -> handler, another node, max",
            remote["latency_s"]["max"],
            renew_s + RENEW_ROUND_TRIP_S,
            unit=" s",
            note=f"one renew interval (run lease {args.cancel_run_lease_s:g} s / 3) + {RENEW_ROUND_TRIP_S:g} s",
        ),
    ]
    return {
        "scenario": "cancel",
        "server": bdb.server_version,
        "rows": rows,
        "renew_interval_s": renew_s,
        "tables": [table],
        "targets": targets,
        "notes": [
            "latency = from sending POST /v1/tasks/{id}/cancel to the handler catching trio.Cancelled; "
            "cancels land at random moments within the spread (same node: 1 s; another node: one renew interval).",
        ],
    }


def plot(report: dict[str, Any], outdir: Any, plots: Any) -> list[Any]:
    return []
