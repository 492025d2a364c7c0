"""S3 priority: a mixed-priority backlog drained through a real node.

``--s3-tasks`` due tasks of one queue, priorities 0-9 uniformly, ``available_at``
spread uniformly over the last ``--s3-spread-s`` seconds (seeded with INSERT ...
SELECT), drained by SDK Workers over WebSocket. Per level: the wait available ->
dispatch. The observed ordering advantage of level 9 over level 0 (how much newer a
level-9 task dispatched before an older level-0 task was) must stay at or under
9 x 30 s = 270 s: old level-0 work is never starved by new level-9 work.
"""

from __future__ import annotations

import argparse
from typing import Any

from .clients import connection_plan, wait_until, worker_fleet
from .database import bench_database, make_app, seed_tasks, task_times
from .processes import node_process
from .report import Target, format_table, max_priority_advantage, summarize

# P3: each level buys at most 30 s of ordering advantage; 9 levels = 270 s.
MAX_ADVANTAGE_S = 270.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--s3-tasks", type=int, default=10_000, help="S3: backlog size (default 10000)")
    parser.add_argument(
        "--s3-spread-s",
        type=float,
        default=600.0,
        help="S3: available_at spread over this many past seconds (default 600)",
    )
    parser.add_argument("--s3-connections", type=int, default=8, help="S3: Worker connections (default 8)")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with bench_database() as bdb:
        app = await make_app(bdb.db, "s3")
        await seed_tasks(
            bdb.db, app, args.s3_tasks, available_s=f"-{args.s3_spread_s} * RAND()", priority="FLOOR(RAND() * 10)"
        )
        async with node_process(bdb.dsn) as node:
            async with worker_fleet(
                node.url, connection_plan(app, args.s3_connections), capacity=args.capacity
            ) as fleet:
                complete = await wait_until(
                    lambda: fleet.completed >= args.s3_tasks, timeout_s=max(120.0, args.s3_tasks / 20), poll_s=0.1
                )
        rows = await task_times(bdb.db, "application_id = %s AND state = 'succeeded'", (app.application_id,))
    # The drain's own wait: from the first reservation of the run to the task's (all were due by then).
    drain_start = min((r["reserved"] for r in rows), default=0.0)
    for r in rows:
        r["in_drain"] = r["reserved"] - drain_start
    by_level = {level: summarize(r["to_dispatch"] for r in rows if r["priority"] == level) for level in range(10)}
    in_drain = {level: summarize(r["in_drain"] for r in rows if r["priority"] == level) for level in range(10)}
    advantage = max_priority_advantage([(r["priority"], r["available"]) for r in rows])
    oldest_level0 = max((r["to_dispatch"] for r in rows if r["priority"] == 0), default=float("nan"))
    table = format_table(
        [
            "priority",
            "tasks",
            "wait mean s",
            "wait p50 s",
            "wait p99 s",
            "wait max s",
            "in-drain mean s",
            "in-drain p99 s",
        ],
        [
            [
                level,
                s["count"],
                s["mean"],
                s["p50"],
                s["p99"],
                s["max"],
                in_drain[level]["mean"],
                in_drain[level]["p99"],
            ]
            for level, s in by_level.items()
        ],
    )
    targets = [
        Target.at_most(
            "S3 max advantage of level 9 over level 0",
            advantage,
            MAX_ADVANTAGE_S,
            unit=" s",
            note="ordering only; 270 s = 9 levels x 30 s",
        )
    ]
    return {
        "scenario": "s3",
        "server": bdb.server_version,
        "figures": {
            "by_level": by_level,
            "in_drain_by_level": in_drain,
            "max_advantage_s": advantage,
            "complete": complete,
            "oldest_level0_wait_s": oldest_level0,
            "samples": {str(level): [r["to_dispatch"] for r in rows if r["priority"] == level] for level in range(10)},
            "drain_samples": {
                str(level): [r["in_drain"] for r in rows if r["priority"] == level] for level in range(10)
            },
        },
        "tables": [table],
        "targets": targets,
        "notes": [
            f"{args.s3_tasks:,} tasks due over the last {args.s3_spread_s:g} s, priorities 0-9 uniform, drained by "
            f"{args.s3_connections} connections x capacity {args.capacity}; waits from available_at (database clock), "
            "so they include the backlog's age; in-drain: from the run's first reservation to the task's.",
            f"observed max advantage {advantage:.1f} s: no level-9 task overtook a level-0 task more than "
            f"{advantage:.1f} s older than itself.",
        ],
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    samples = report["figures"]["samples"]
    drain = report["figures"]["drain_samples"]
    return [
        plots.boxes(
            outdir / "s3-wait-by-priority.png",
            {k: samples[k] for k in sorted(samples, key=int)},
            title="S3: wait available -> dispatch by priority (whiskers p1-p99)",
            xlabel="priority",
            ylabel="seconds",
        ),
        plots.boxes(
            outdir / "s3-drain-wait-by-priority.png",
            {k: drain[k] for k in sorted(drain, key=int)},
            title="S3: when in the drain each level was dispatched (whiskers p1-p99)",
            xlabel="priority",
            ylabel="seconds after the first reservation",
        ),
    ]
