"""Shards: S1's burn-down with every application on one database server, then on two.

Two applications, half the tasks each (written with SQL: the drain is what is measured,
as in S1), drained by one node process with SDK Workers (``--capacity`` each, S1's 8
connections, half per application). With 1 shard both applications live on the bench
database; with 2 shards the node maps the second application to a private ``mariadbd``
the scenario starts (``--no-defaults``, its own datadir and port; harness/mariadb.py)
through ORBIT_SHARDS. Headline: tasks/s of each and their ratio.

On one 2-core machine the node, the Workers and both servers share the same cores, so
the ratio says what a second server adds when the CPU is already shared, not what a
second machine would add (bench/README.md).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from harness.mariadb import PrivateMariaDB
from orbit_node.db import Database, migrate
from orbit_node.domain.dsn import Dsn

from .accounting import measured_phase
from .clients import connection_plan, wait_until, worker_fleet
from .database import App, bench_database, count_tasks, make_app, seed_tasks
from .processes import node_process
from .report import format_table, ratio
from .s1 import S1_CONNECTIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """None of its own: ``--tasks`` and ``--capacity`` are S1's (the same burn-down, split
    over two applications)."""


async def burndown(
    apps: list[tuple[App, Database]], *, main_dsn: Dsn, shards: str, tasks: int, capacity: int
) -> dict[str, Any]:
    """Seed ``tasks`` split evenly over ``apps`` (each on its database), drain them with one node."""
    share = tasks // len(apps)
    for app, db in apps:
        await seed_tasks(db, app, share)
    total = share * len(apps)
    per_app = max(1, S1_CONNECTIONS // len(apps))
    plan = [slot for app, _ in apps for slot in connection_plan(app, per_app)]
    async with node_process(main_dsn, shards=shards) as node:
        async with measured_phase(node.pid, profile=False) as phase:
            start = time.perf_counter()
            async with worker_fleet(node.url, plan, capacity=capacity) as fleet:
                finished = await wait_until(lambda: fleet.completed >= total, timeout_s=max(120.0, total / 20))
                seconds = time.perf_counter() - start
                done = fleet.completed
        stats = node.last_stats()
    succeeded = {
        app.name: await count_tasks(db, "application_id = %s AND state = 'succeeded'", (app.application_id,))
        for app, db in apps
    }
    return {
        "tasks": done,
        "seconds": seconds,
        "tasks_per_s": done / seconds,
        "complete": finished,
        "succeeded_in_db": succeeded,
        "connections": len(plan),
        "capacity": capacity,
        "turns_by_application": stats.get("turns_by_application", {}),
        "node_cpu_us_per_task": ratio(phase.cpu["node_cpu_s"] * 1e6, done),
        "cpu": phase.cpu,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = PrivateMariaDB()
    async with bench_database() as bdb:
        one = await burndown(
            [(await make_app(bdb.db, f"shards1-{side}"), bdb.db) for side in ("a", "b")],
            main_dsn=bdb.dsn,
            shards="",
            tasks=args.tasks,
            capacity=args.capacity,
        )
        try:
            await server.start()
            shard_db = Database(server.dsn(), size=4)
            try:
                await migrate.up(shard_db)
                apps = [
                    (await make_app(bdb.db, "shards2-a"), bdb.db),
                    (await make_app(shard_db, "shards2-b"), shard_db),
                ]
                two = await burndown(
                    apps,
                    main_dsn=bdb.dsn,
                    shards=f"shards2-b={server.dsn().url()}",
                    tasks=args.tasks,
                    capacity=args.capacity,
                )
            finally:
                await shard_db.aclose()
        finally:
            with trio.CancelScope(shield=True):
                await server.stop()
                server.remove()
    rows = [
        [
            label,
            result["tasks_per_s"],
            ratio(result["tasks_per_s"], one["tasks_per_s"]),
            result["seconds"],
            result["node_cpu_us_per_task"],
            args.units.r(result["node_cpu_us_per_task"]),
            f"{result['tasks']:,} tasks, {result['connections']} connections x capacity {result['capacity']}"
            + ("" if result["complete"] else " [DID NOT FINISH]"),
        ]
        for label, result in (("1 shard (one server)", one), ("2 shards (two servers)", two))
    ]
    table = format_table(
        ["deployment", "tasks/s", "/ 1 shard", "seconds", "node us/task", "R/task", "setup"], rows, align="lrrrrrl"
    )
    notes = [
        f"{args.tasks:,} no-op tasks per run, half per application, written with SQL before the Workers start; "
        "one node process serves both applications (ORBIT_SHARDS maps the second one to shard 2 in the 2-shard run).",
        "Shard 2 is a private mariadbd (64 MB buffer pool, innodb_flush_log_at_trx_commit=1) on the same machine: "
        "node, Workers and both servers share its cores, so the ratio is not what a second machine adds.",
    ]
    return {
        "scenario": "shards",
        "server": bdb.server_version,
        "figures": {"one_shard": one, "two_shards": two, "ratio": ratio(two["tasks_per_s"], one["tasks_per_s"])},
        "tables": [table],
        "notes": notes,
        "profiles": {},
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    f = report["figures"]
    return [
        plots.bar(
            outdir / "shards-throughput.png",
            ["1 shard", "2 shards"],
            [f["one_shard"]["tasks_per_s"], f["two_shards"]["tasks_per_s"]],
            title="Shards: burn-down tasks/s, one node",
            ylabel="tasks/s",
        )
    ]
