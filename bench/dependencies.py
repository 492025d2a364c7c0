"""Dependencies: how soon a child runs once its last parent has finished, and what a
parent's Finish costs with children (docs/api.md, "Dependencies").

Release latency. Two node processes, A and B, on one database; SDK Workers in this
process. Each sample runs alone (the next starts once it is done):

(Samples are 0.3 s apart: a Worker connection claims at most 4 times a second, so a
sample that came sooner would measure the pace, not the wake-up.)

* plain pickup (the baseline): a task submitted alone, from its acceptance (``created_at``,
  the database clock) to its handler entered, served by a Worker of node A (the node it
  was submitted to) or only by one of node B;
* one node: a parent and its child submitted in one batch (``depends_on_keys``), both
  served by a Worker of node A: from the parent's finish (``finished_at``, written by the
  Finish transaction that releases the child) to the child's handler entered;
* across nodes: the same with the child's handler served by a Worker of node B only, which
  hears of the release through the signal table.

The database runs on this machine, so its clock and this process's are one. Goal: p50
within 20 ms of the plain pickup's.

Finish cost. Burn-downs of ``--deps-finish-tasks`` parents on node A alone, each measured
as node A's and the database server's CPU per parent: parents without children; each
with a child that goes on waiting (its other parent is never served: the Finish counts it
off); each with a child it releases (nobody serves the child: it stays queued). With
``--deps-before TREE`` the burn-down without children also runs on TREE's node (on the
same database: the migrations since TREE are compatible), in pairs with this tree's: a
Finish without children must cost no more than before.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import trio

from orbit_sdk import OrbitClient, SubmitTaskRequest, Worker, WorkerTask

from .accounting import CpuMeter
from .database import bench_database, make_app
from .footprint import server_pid
from .processes import node_process
from .report import Target, format_table, ms, summarize

PARENT = ("bench.parent", "v1", "v1")
CHILD = ("bench.child", "v1", "v1")
# A handler no Worker serves: its tasks stay where they are (queued).
NOBODY = ("bench.nobody", "v1", "v1")
# The goal: a released child's p50 within this of a plain task's pickup p50.
GOAL_OVER_PICKUP_S = 0.020
SAMPLE_TIMEOUT_S = 30.0
# Between two latency samples: longer than a connection's claim pace (one claim per 250 ms).
SAMPLE_GAP_S = 0.3
# Latency paths: each release path follows the plain pickup it is compared with.
PATHS = ("plain, one node", "one node", "plain, across nodes", "across nodes")
FINISH_CAPACITY = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--deps-samples", type=int, default=100, help="samples per latency path (default 100)")
    parser.add_argument(
        "--deps-finish-tasks", type=int, default=2000, help="parents per Finish-cost burn-down (default 2000)"
    )
    parser.add_argument("--deps-pairs", type=int, default=3, help="Finish-cost rounds, each every variant (default 3)")
    parser.add_argument("--deps-before", type=Path, help="a source tree whose node's Finish without children to pair")


def epoch(value: datetime) -> float:
    """Seconds since the epoch of a database DATETIME (naive UTC) or an aware datetime."""
    return (value if value.tzinfo is not None else value.replace(tzinfo=UTC)).timestamp()


def request(queue_id: str, handler: tuple[str, str, str], **extra: Any) -> SubmitTaskRequest:
    return SubmitTaskRequest(
        queue_id=queue_id,
        handler=handler[0],
        handler_version=handler[1],
        payload_version=handler[2],
        payload={},
        **extra,
    )


@attrs.define(eq=False)
class Entered:
    """When each task's handler was entered (this process's clock), and a wake-up per task."""

    at: dict[str, float] = attrs.field(factory=dict)
    events: dict[str, trio.Event] = attrs.field(factory=dict)

    def event(self, task_id: str) -> trio.Event:
        return self.events.setdefault(task_id, trio.Event())

    async def __call__(self, task: WorkerTask) -> None:
        self.at[task.task_id] = time.time()
        self.event(task.task_id).set()


async def finished_at(db: Any, task_id: str) -> datetime:
    for _ in range(100):
        rows = await db.run(
            lambda tx: tx.fetchall_raw("SELECT finished_at, created_at FROM tasks WHERE task_id = %s", (task_id,))
        )
        if rows and rows[0]["finished_at"] is not None:
            return rows[0]["finished_at"]
        await trio.sleep(0.01)
    raise RuntimeError(f"task {task_id} did not finish")


async def latency_path(db: Any, client: OrbitClient, app: Any, entered: Entered, samples: int, path: str) -> dict:
    run = time.time_ns()
    latencies: list[float] = []
    across = path.endswith("across nodes")
    child_handler = (CHILD[0] + ".b", CHILD[1], CHILD[2]) if across else CHILD
    for n in range(samples):
        if path.startswith("plain"):
            done = await client.submit_task(f"plain-{run}-{n}", request(app.queue_id, child_handler))
            task_id = done.task.task_id
            with trio.fail_after(SAMPLE_TIMEOUT_S):
                await entered.event(task_id).wait()
            latencies.append(entered.at[task_id] - epoch(done.task.created_at))
        else:
            fan = await client.submit_fan_in(
                [(f"p-{run}-{n}", request(app.queue_id, PARENT))],
                (f"c-{run}-{n}", request(app.queue_id, child_handler)),
            )
            parent_id, child_id = fan.parts[0].task_id, fan.join.task_id
            assert parent_id is not None and child_id is not None
            with trio.fail_after(SAMPLE_TIMEOUT_S):
                await entered.event(child_id).wait()
            latencies.append(entered.at[child_id] - epoch(await finished_at(db, parent_id)))
        # Past the connection's claim pace (4 claims a second): each sample is woken, not paced.
        await trio.sleep(SAMPLE_GAP_S + random.uniform(0, 0.05))
    return {"path": path, "samples": len(latencies), "latency_s": summarize(latencies)}


async def finish_cost(dsn: Any, db: Any, app: Any, variant: str, tasks: int, tree: Path | None) -> dict[str, Any]:
    """One burn-down of ``tasks`` parents on a node of its own; CPU per parent."""
    run = time.time_ns()
    async with node_process(dsn, tree=tree) as node, OrbitClient(node.url, app.token) as client:
        blocker = None
        if variant == "counted":
            blocker = (await client.submit_task(f"blocker-{run}", request(app.queue_id, NOBODY))).task.task_id
        for start in range(0, tasks, 500):
            items: list[tuple[str, SubmitTaskRequest]] = []
            for n in range(start, min(tasks, start + 500)):
                items.append((f"{variant}-{run}-{n}", request(app.queue_id, PARENT)))
                if variant != "none":
                    extra: dict[str, Any] = {"depends_on_keys": (f"{variant}-{run}-{n}",)}
                    if blocker is not None:
                        extra["depends_on"] = (blocker,)
                    items.append((f"{variant}-{run}-{n}-child", request(app.queue_id, NOBODY, **extra)))
            results = await client.submit_many(items, return_tasks=False)
            refused = [r.error for r in results if r.error is not None]
            if refused:
                raise RuntimeError(f"submit refused: {refused[0]}")
        worker = Worker(node.url, app.token, [app.queue_id], capacity=FINISH_CAPACITY, client_name="bench")

        async def parent(task: WorkerTask) -> None:
            return None

        worker.register(*PARENT, parent)
        meter = CpuMeter({"node": node.pid, **({"database": pid} if (pid := await server_pid(db)) else {})})
        async with trio.open_nursery() as nursery:
            meter.start()
            await nursery.start(worker.run)
            with trio.fail_after(600):
                await worker.wait_finished(tasks)
            used = meter.stop()
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await worker.drain()
            nursery.cancel_scope.cancel()
    cpu = used["node_cpu_s"] + used.get("database_cpu_s", 0.0)
    return {
        "variant": variant,
        "tree": str(tree or "this"),
        "tasks": tasks,
        "cpu_ms_per_task": 1000 * cpu / tasks,
        **used,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    entered = Entered()
    rows: list[dict[str, Any]] = []
    async with bench_database() as bdb:
        app = await make_app(bdb.db, "deps")
        async with (
            node_process(bdb.dsn) as a,
            node_process(bdb.dsn) as b,
            OrbitClient(a.url, app.token) as client,
        ):
            on_a = Worker(a.url, app.token, [app.queue_id], capacity=16, client_name="bench-a")
            on_b = Worker(b.url, app.token, [app.queue_id], capacity=16, client_name="bench-b")
            for handler in (PARENT, CHILD):
                on_a.register(*handler, entered)
            on_b.register(CHILD[0] + ".b", CHILD[1], CHILD[2], entered)
            async with trio.open_nursery() as nursery:
                await nursery.start(on_a.run)
                await nursery.start(on_b.run)
                for path in PATHS:
                    rows.append(await latency_path(bdb.db, client, app, entered, args.deps_samples, path))
                for worker in (on_a, on_b):
                    with trio.CancelScope(shield=True), trio.move_on_after(10):
                        await worker.drain()
                nursery.cancel_scope.cancel()
        costs: list[dict[str, Any]] = []
        for _ in range(args.deps_pairs):
            for variant in ("none", "counted", "released"):
                costs.append(await finish_cost(bdb.dsn, bdb.db, app, variant, args.deps_finish_tasks, None))
            if args.deps_before is not None:
                # The older node on this database: its migrations since are all compatible.
                costs.append(await finish_cost(bdb.dsn, bdb.db, app, "none", args.deps_finish_tasks, args.deps_before))
    plain = {r["path"]: r["latency_s"]["p50"] for r in rows if r["path"].startswith("plain")}

    def over(r: dict[str, Any]) -> float:
        return r["latency_s"]["p50"] - plain[r["path"] if r["path"].startswith("plain") else "plain, " + r["path"]]

    latency = format_table(
        ["path", "samples", "p50 ms", "p90 ms", "p99 ms", "p50 over its plain pickup ms"],
        [
            [
                r["path"],
                r["samples"],
                ms(r["latency_s"]["p50"]),
                ms(r["latency_s"]["p90"]),
                ms(r["latency_s"]["p99"]),
                ms(over(r)),
            ]
            for r in rows
        ],
        align="lrrrrr",
    )

    def median(variant: str, tree: str = "this") -> float:
        return statistics.median(c["cpu_ms_per_task"] for c in costs if c["variant"] == variant and c["tree"] == tree)

    base = median("none")
    cost_rows = [[v, f"{median(v):.3f}", f"{median(v) / base:.2f}"] for v in ("none", "counted", "released")]
    if args.deps_before is not None:
        old = median("none", str(args.deps_before))
        cost_rows.append([f"none, node of {args.deps_before}", f"{old:.3f}", f"{old / base:.2f}"])
    cost = format_table(
        ["parents' Finish", "node + database CPU ms per parent (median)", "x none"], cost_rows, align="lrr"
    )
    targets = [
        Target.at_most(f"release p50 - plain pickup p50, {r['path']}", over(r), GOAL_OVER_PICKUP_S, unit=" s")
        for r in rows
        if not r["path"].startswith("plain")
    ]
    if args.deps_before is not None:
        targets.append(
            Target.at_most(
                "Finish without children, this node / before", base / median("none", str(args.deps_before)), 1.05
            )
        )
    return {
        "scenario": "dependencies",
        "server": bdb.server_version,
        "rows": rows,
        "costs": costs,
        "tables": [latency, cost],
        "targets": targets,
        "notes": [
            "release latency: the parent's finished_at (database clock, the Finish transaction) -> the child's "
            "handler entered; plain pickup: created_at -> handler entered; samples one at a time.",
            "Finish cost: node + mariadbd CPU per parent over a burn-down, capacity-64 Worker, medians of the rounds.",
        ],
    }
