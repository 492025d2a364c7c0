"""E2E: submit -> finish tasks/s with 1, 8 and 64 Worker connections, beside the SQL floor.

The Workers are connected first; then ``--e2e-tasks`` no-op tasks are submitted over
HTTP (16 clients) while they run. tasks/s = tasks / (first submit -> last finish).
available->dispatch and available->start come from the database clock (``reserved_at``,
``started_at`` minus ``available_at``). The SQL floor (S0) is measured in the same run.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from .common import (
    bench_database,
    connection_plan,
    make_app,
    measured_phase,
    node_process,
    submit_closed_loop,
    task_times,
    wait_until,
    worker_fleet,
)
from .report import Target, format_table, ms, ratio, summarize
from .s0 import measure_floor
from .s1 import pacing_bound

# Issue 13 target: submit -> finish tasks/s with 64 Worker connections over the SQL floor of the same run.
TARGET_VS_FLOOR = 0.5
TARGET_CONNECTIONS = 64
# A row submits at most this many tasks per Worker connection, so the 1-connection row
# (paced to <= 64 tasks/s) stays within about half a minute.
TASKS_PER_CONNECTION = 500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--e2e-tasks",
        type=int,
        default=6_000,
        help=f"e2e: tasks per row, at most {TASKS_PER_CONNECTION} per connection (default 6000)",
    )
    parser.add_argument("--e2e-connections", default="1,8,64", help="e2e: Worker connection counts (default 1,8,64)")


async def submit_to_finish(
    bdb, node, *, tasks: int, connections: int, capacity: int, submit_concurrency: int, profile: bool
) -> dict[str, Any]:
    app = await make_app(bdb.db, f"e2e-{connections}")
    stats_before = node.last_stats()
    async with worker_fleet(node.url, connection_plan(app, connections), capacity=capacity) as fleet:
        with measured_phase(node.pid, profile=profile) as phase:
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
        "connections": connections,
        "capacity": capacity,
        "tasks": done,
        "complete": complete,
        "seconds": seconds,
        "tasks_per_s": done / seconds,
        "submit_tasks_per_s": tasks / submit_s,
        "submit_latency_s": summarize(submit_lat),
        "to_dispatch_s": summarize(t["to_dispatch"] for t in times),
        "to_start_s": summarize(t["to_start"] for t in times),
        "pacing_bound_tasks_per_s": pacing_bound(connections, capacity),
        "mean_claim_batch": ratio(reserved, claims),
        "cpu": phase.cpu,
        "profile": phase.profile,
        "dispatch_samples": [t["to_dispatch"] for t in times],
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(c) for c in args.e2e_connections.split(",")]
    runs = []
    async with bench_database() as bdb:
        floor = await measure_floor(bdb, args.floor_tasks)
        async with node_process(bdb.dsn) as node:
            for connections in counts:
                runs.append(
                    await submit_to_finish(
                        bdb,
                        node,
                        tasks=min(args.e2e_tasks, TASKS_PER_CONNECTION * connections),
                        connections=connections,
                        capacity=args.capacity,
                        submit_concurrency=args.submit_concurrency,
                        profile=not args.no_profile and connections == max(counts),
                    )
                )
    rows = [
        [
            r["connections"],
            r["tasks"],
            r["tasks_per_s"],
            ratio(r["tasks_per_s"], floor["tasks_per_s"]),
            r["pacing_bound_tasks_per_s"],
            r["submit_tasks_per_s"],
            r["mean_claim_batch"],
            ms(r["to_dispatch_s"]["p50"]),
            ms(r["to_dispatch_s"]["p99"]),
            ms(r["to_start_s"]["p50"]),
            ms(r["to_start_s"]["p99"]),
            r["cpu"]["machine_utilisation"],
        ]
        for r in runs
    ]
    rows.append(
        ["SQL floor", floor["tasks"], floor["tasks_per_s"], 1.0, "-", "-", floor["batch"], "-", "-", "-", "-", "-"]
    )
    table = format_table(
        [
            "connections",
            "tasks",
            "tasks/s",
            "x floor",
            "pacing bound",
            "submit/s",
            "claim batch",
            "dispatch p50 ms",
            "dispatch p99 ms",
            "start p50 ms",
            "start p99 ms",
            "cpu busy",
        ],
        rows,
    )
    big = runs[-1]
    judged = next((r for r in runs if r["connections"] == TARGET_CONNECTIONS), big)
    target = Target.at_least(
        f"E2E {judged['connections']} connections / SQL floor",
        ratio(judged["tasks_per_s"], floor["tasks_per_s"]),
        TARGET_VS_FLOOR,
        note=f"issue's target at {TARGET_CONNECTIONS} connections; pacing bound "
        f"{judged['pacing_bound_tasks_per_s']:,.0f} tasks/s",
    )
    return {
        "scenario": "e2e",
        "server": bdb.server_version,
        "figures": {"runs": runs, "floor": floor},
        "tables": [table],
        "targets": [target],
        "notes": [
            f"min({args.e2e_tasks:,}, {TASKS_PER_CONNECTION} x connections) tasks per row, Worker capacity {args.capacity}, {args.submit_concurrency} HTTP submitters; "
            "tasks/s = tasks / (first submit -> last finish); waits on the database clock.",
            "pacing bound: connections x 4 claims/s x min(capacity, 16): the most the P3 per-connection pace allows.",
            "cpu busy: share of both cores busy (node + harness + MariaDB + anything else on the machine).",
        ],
        "profiles": {f"the node, {big['connections']} connections": big["profile"]} if big.get("profile") else {},
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    runs = report["figures"]["runs"]
    return [
        plots.bar(
            outdir / "e2e-throughput.png",
            [f"{r['connections']} conn" for r in runs] + ["SQL floor"],
            [r["tasks_per_s"] for r in runs] + [report["figures"]["floor"]["tasks_per_s"]],
            title="E2E: submit -> finish tasks/s",
            ylabel="tasks/s",
        ),
        plots.cdf(
            outdir / "e2e-dispatch-latency.png",
            {f"{r['connections']} conn": [max(v, 1e-4) for v in r["dispatch_samples"]] for r in runs},
            title="E2E: available -> dispatch (database clock)",
            xlabel="seconds",
        ),
    ]
