"""E2E: submit -> finish tasks/s in S1's Worker shapes, beside the S1 drain and the SQL floor.

The Workers are connected first (``--e2e-connections`` connections of each capacity of
``--capacities``, each with a no-op handler and one waiting ``--handler-ms``); then up to
``--e2e-tasks`` tasks are submitted one by one over HTTP (16 clients) while they run.
tasks/s = tasks / (first submit -> last finish). available->dispatch and available->start
come from the database clock (``reserved_at``, ``started_at`` minus ``available_at``).
Node CPU per task (submit and execution) in microseconds and in R. The S1 drain (8
connections x capacity 64, no-op) is S1's of the same invocation at the same durability
when S1 ran before (``python -m bench all``), else measured here, like the SQL floor.
Then the peers with an end-to-end mode (Huey, Celery, Dramatiq: ``bench/thread_peers.py``),
each in its own process at each of ``--peer-concurrency``: workers first, then the same
number of tasks enqueued one by one from as many threads as Orbit has HTTP submitters;
each compared at its best with Orbit's best no-op row (tasks/s, submit -> start, the
machine's CPU per task). At each durability setting by default (a column each).
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

from . import durability
from .accounting import measured_phase
from .clients import connection_plan, submit_closed_loop, wait_until, worker_fleet
from .database import bench_database, make_app, task_times
from .grids import figures_at, grid
from .peers import E2E_PEERS
from .processes import node_process
from .report import Target, ms, ratio, summarize
from .s0 import measure_floor
from .s1 import (
    S1_CONNECTIONS,
    Shape,
    best_run,
    concurrency_grid,
    machine_us_per_task,
    orbit_burndown,
    pacing_bound,
    parse_shapes,
    peer_setup,
    python_cpu_s,
    run_peers,
    wanted_peers,
)
from .units import Units, cost

# bench/__main__.py: one column per durability setting, both by default.
DURABILITY_COLUMNS = True
DURABILITY_DEFAULT = "both"
# Issue 27: submit -> finish tasks/s at production durability over the S1 drain, both in
# the shape of S1's drain (8 connections x capacity 64, no-op handler).
TARGET_VS_S1 = 0.5
REFERENCE = Shape(64, 0, S1_CONNECTIONS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--e2e-tasks",
        type=int,
        default=3_000,
        help="e2e: tasks per row, at most its pacing bound x --shape-seconds (default 3000)",
    )
    parser.add_argument(
        "--e2e-connections", default=str(S1_CONNECTIONS), help="e2e: Worker connections of each shape (default 8)"
    )


async def submit_to_finish(
    bdb, node, *, tasks: int, shape: Shape, submit_concurrency: int, profile: bool
) -> dict[str, Any]:
    app = await make_app(bdb.db, f"e2e-{shape.connections}-{shape.capacity}-{shape.handler_ms}")
    stats_before = node.last_stats()
    plan = connection_plan(app, shape.connections)
    async with worker_fleet(node.url, plan, capacity=shape.capacity, handler_s=shape.handler_ms / 1000) as fleet:
        async with measured_phase(node.pid, profile=profile) as phase:
            start = time.perf_counter()
            submit_lat = await submit_closed_loop(
                node.url, app.token, app.queue_id, tasks, concurrency=submit_concurrency
            )
            submit_s = time.perf_counter() - start
            complete = await wait_until(lambda: fleet.completed >= tasks, timeout_s=max(120.0, tasks / 10))
            seconds = time.perf_counter() - start
            done = fleet.completed
    stats_after = node.last_stats()
    times = await task_times(bdb.db, "application_id = %s AND state = 'succeeded'", (app.application_id,))
    claims = stats_after.get("claims_with_tasks", 0) - stats_before.get("claims_with_tasks", 0)
    reserved = stats_after.get("tasks_reserved", 0) - stats_before.get("tasks_reserved", 0)
    return {
        "connections": shape.connections,
        "capacity": shape.capacity,
        "handler_ms": shape.handler_ms,
        "tasks": done,
        "complete": complete,
        "seconds": seconds,
        "tasks_per_s": done / seconds,
        "submit_tasks_per_s": tasks / submit_s,
        "submit_latency_s": summarize(submit_lat),
        "to_dispatch_s": summarize(t["to_dispatch"] for t in times),
        "to_start_s": summarize(t["to_start"] for t in times),
        "pacing_bound_tasks_per_s": pacing_bound(shape.connections, shape.capacity),
        "mean_claim_batch": ratio(reserved, claims),
        "node_cpu_us_per_task": ratio(phase.cpu["node_cpu_s"] * 1e6, done),
        "cpu": phase.cpu,
        "profile": phase.profile,
        "dispatch_samples": [t["to_dispatch"] for t in times],
    }


async def s1_drain(args: argparse.Namespace, bdb, here: str) -> tuple[float, str]:
    """(tasks/s, where it comes from) of the S1 drain in REFERENCE's shape at this durability."""
    s1 = (getattr(args, "context", None) or {}).get("s1")
    figures = figures_at(s1, here) if s1 else None
    for run in (figures or {}).get("orbit_runs", []):
        if (run["capacity"], run["handler_ms"], run["connections"]) == (
            REFERENCE.capacity,
            REFERENCE.handler_ms,
            REFERENCE.connections,
        ):
            return run["tasks_per_s"], "S1 of this invocation"
    drained = await orbit_burndown(
        bdb,
        tasks=REFERENCE.tasks(args.tasks, args.shape_seconds),
        connections=REFERENCE.connections,
        capacity=REFERENCE.capacity,
        submit_concurrency=args.submit_concurrency,
        profile=False,
        app_name="e2e-s1-drain",
        seed_sql=True,
    )
    return drained["tasks_per_s"], f"measured here: {drained['tasks']:,} tasks written with SQL, then drained"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(c) for c in args.e2e_connections.split(",") if c.strip()]
    shapes = [s for n in counts for s in parse_shapes(args.capacities, args.handler_ms, connections=n)]
    peers_wanted, peer_concurrency = wanted_peers(args, among=E2E_PEERS)
    units: Units = args.units
    ran_at = durability.current()
    here = ran_at.name
    runs = []
    async with bench_database() as bdb:
        floor = await measure_floor(bdb, args.floor_tasks)
        drain_per_s, drain_source = await s1_drain(args, bdb, here)
        async with node_process(bdb.dsn) as node:
            for shape in shapes:
                runs.append(
                    await submit_to_finish(
                        bdb,
                        node,
                        tasks=shape.tasks(args.e2e_tasks, args.shape_seconds),
                        shape=shape,
                        submit_concurrency=args.submit_concurrency,
                        profile=not args.no_profile and shape == REFERENCE,
                    )
                )
        peer_runs = await run_peers(
            peers_wanted,
            peer_concurrency,
            args.e2e_tasks,
            bdb.dsn,
            args.peer_timeout_s,
            ran_at=ran_at,
            mode="e2e",
            submitters=args.submit_concurrency,
        )
    peers = {name: best_run(by_concurrency) for name, by_concurrency in peer_runs.items()}
    orbit = max((r for r in runs if not r["handler_ms"]), key=lambda r: r["tasks_per_s"], default=runs[0])
    rows = [
        [
            r["connections"],
            r["capacity"],
            "no-op" if not r["handler_ms"] else f"{r['handler_ms']} ms",
            r["tasks"],
            r["tasks_per_s"],
            ratio(r["tasks_per_s"], drain_per_s),
            ratio(r["tasks_per_s"], floor["tasks_per_s"]),
            r["pacing_bound_tasks_per_s"],
            r["submit_tasks_per_s"],
            r["mean_claim_batch"],
            r["node_cpu_us_per_task"],
            units.r(r["node_cpu_us_per_task"]),
            ms(r["to_dispatch_s"]["p50"]),
            ms(r["to_dispatch_s"]["p99"]),
            ms(r["to_start_s"]["p99"]),
            r["cpu"]["machine_utilisation"],
        ]
        for r in runs
    ]
    table = grid(
        ["connections", "capacity", "handler"],
        [
            "tasks",
            "tasks/s",
            "x S1 drain",
            "x floor",
            "pacing bound",
            "submit/s",
            "claim batch",
            "node us/task",
            "R/task",
            "dispatch p50 ms",
            "dispatch p99 ms",
            "start p99 ms",
            "cpu busy",
        ],
        rows,
        here,
    )
    peer_rows = [
        [
            "Orbit (best no-op row)",
            f"{orbit['connections']} x {orbit['capacity']}",
            orbit["tasks_per_s"],
            1.0,
            ms(orbit["to_start_s"]["p50"]),
            ms(orbit["to_start_s"]["p99"]),
            python_cpu_s(orbit),
            *machine_us_per_task(orbit),
        ]
    ]
    for name, peer in peers.items():
        # A peer that did not run has none of these: its row shows n/a.
        latency = peer.get("start_latency_s", {})
        peer_rows.append(
            [
                f"{name} (best)",
                peer.get("concurrency", ""),
                peer.get("tasks_per_s", math.nan),
                ratio(orbit["tasks_per_s"], peer.get("tasks_per_s", math.nan)),
                ms(latency.get("p50", math.nan)),
                ms(latency.get("p99", math.nan)),
                peer.get("cpu_s", math.nan),
                *machine_us_per_task(peer),
            ]
        )
    against_peers = grid(
        ["system"],
        [
            "concurrency",
            "tasks/s",
            "Orbit / this",
            "start p50 ms",
            "start p99 ms",
            "python cpu s",
            "machine us/task",
            "outside python us/task",
        ],
        peer_rows,
        here,
        title="against the peers: submitted one by one while they run",
    )
    reference = (REFERENCE.connections, REFERENCE.capacity, REFERENCE.handler_ms)
    judged = next((r for r in runs if (r["connections"], r["capacity"], r["handler_ms"]) == reference), runs[-1])
    targets = []
    if here == "prod":
        targets.append(
            Target.at_least(
                f"E2E {judged['connections']} x capacity {judged['capacity']} / S1 drain",
                ratio(judged["tasks_per_s"], drain_per_s),
                TARGET_VS_S1,
                unit="x",
                note=f"S1 drain {drain_per_s:,.0f} tasks/s ({drain_source}); "
                f"node {cost(judged['node_cpu_us_per_task'], units)} per task",
            )
        )
    notes = [
        f"up to {args.e2e_tasks:,} tasks per row (at most its pacing bound x {args.shape_seconds:g} s), "
        f"{args.submit_concurrency} HTTP submitters sending single submits; "
        "tasks/s = tasks / (first submit -> last finish); waits on the database clock.",
        f"S1 drain: {drain_per_s:,.0f} tasks/s, {REFERENCE.connections} connections x capacity "
        f"{REFERENCE.capacity}, no-op handler ({drain_source}); SQL floor: {floor['tasks_per_s']:,.0f} tasks/s.",
        "pacing bound: connections x 4 claims/s x min(capacity, 64): the most the P3 per-connection pace allows.",
        "node us/task: the node process's CPU over the row (submits and execution) / tasks; R/task: the same in R.",
        "cpu busy: share of both cores busy (node + harness + MariaDB + anything else on the machine).",
    ]
    notes += [
        f"WARNING: {r['connections']} x {r['capacity']} ({r['handler_ms']} ms) did not finish: {r['tasks']:,} done"
        for r in runs
        if not r["complete"]
    ]
    if peers:
        notes += [
            f"peers: {args.e2e_tasks:,} no-op tasks each, at {', '.join(str(c) for c in peer_concurrency)} (its best "
            f"counts); the workers start first, then {args.submit_concurrency} threads of the peer's process enqueue "
            "the tasks one by one. tasks/s = tasks / (first submit -> last acknowledgement). start: Orbit's "
            "available_at -> started_at (database clock), a peer's from just before its enqueue call to its handler's "
            "first line (the process's clock). python cpu s: Orbit's node and harness, a peer's process; machine "
            "us/task: both cores' busy time / tasks.",
            *(peer_setup(name, peer, args.e2e_tasks) for name, peer in peers.items()),
        ]
    return {
        "scenario": "e2e",
        "server": bdb.server_version,
        "figures": {
            "runs": runs,
            "floor": floor,
            "s1_drain_tasks_per_s": drain_per_s,
            "peers": peers,
            "peer_runs": peer_runs,
        },
        "grids": [table, against_peers, concurrency_grid(peer_runs, peers, orbit["tasks_per_s"], here)],
        "targets": targets,
        "notes": notes,
        "profiles": {"the node, 8 x capacity 64, no-op": judged["profile"]} if judged.get("profile") else {},
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    runs = report["figures"]["runs"]
    label = [f"{r['connections']}x{r['capacity']} {r['handler_ms']}ms" for r in runs]
    peers = {name: p for name, p in report["figures"].get("peers", {}).items() if "tasks_per_s" in p}
    return [
        plots.bar(
            outdir / "e2e-throughput.png",
            [*label, "S1 drain", "SQL floor", *peers],
            [r["tasks_per_s"] for r in runs]
            + [report["figures"]["s1_drain_tasks_per_s"], report["figures"]["floor"]["tasks_per_s"]]
            + [p["tasks_per_s"] for p in peers.values()],
            title="E2E: submit -> finish tasks/s",
            ylabel="tasks/s",
        ),
        plots.cdf(
            outdir / "e2e-dispatch-latency.png",
            {name: [max(v, 1e-4) for v in r["dispatch_samples"]] for name, r in zip(label, runs, strict=True)},
            title="E2E: available -> dispatch (database clock)",
            xlabel="seconds",
        ),
    ]
