"""S0 calibration: the database's raw commit rate and Orbit's raw SQL floor.

* raw commit rate: single-row autocommit INSERTs on 1, 4 and 16 connections (one round
  trip and one commit each): what the server can commit at all.
* SQL floor: the dispatch core's own claim -> start -> finish transactions
  (``DispatchStore``, batch 16, 4 loops = the node's 4 claim SQL slots) in a bare loop,
  no HTTP, no WebSocket, no scheduler: the most Orbit's SQL can do on this server.

Other scenarios call ``measure_floor`` so their ratios come from the same run.
"""

from __future__ import annotations

import argparse
from typing import Any

from orbit_node.db import Database
from orbit_node.store.dispatch import DispatchStore

from . import claim
from .common import App, BenchDb, bench_database, make_app
from .report import format_table

# The node's claim batch and claim SQL slots: the floor runs Orbit's SQL the way a node would.
FLOOR_BATCH = 16
FLOOR_LOOPS = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--floor-tasks", type=int, default=10_000, help="tasks drained by the SQL floor (default 10000)"
    )
    parser.add_argument("--commit-seconds", type=float, default=3.0, help="length of each raw commit-rate measurement")
    parser.add_argument("--connections", default="1,4,16", help="raw commit rate connection counts (default 1,4,16)")


async def raw_commit_rates(bdb: BenchDb, connections: list[int], seconds: float) -> dict[int, float]:
    db = Database(bdb.dsn, size=max(connections))
    try:
        await db.run(
            lambda tx: tx.execute_raw(
                "CREATE TABLE IF NOT EXISTS bench_commit (id BIGINT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=InnoDB"
            )
        )
        return {n: await claim.commit_rate(db, connections=n, seconds=seconds) for n in connections}
    finally:
        await db.aclose()


async def measure_floor(bdb: BenchDb, tasks: int, *, app: App | None = None) -> dict[str, Any]:
    """Orbit's claim -> start -> finish SQL, batch 16, 4 loops, in a bare loop: tasks/s."""
    app = app or await make_app(bdb.db, "floor")
    owner = {"application_id": app.application_id, "namespace_id": app.namespace_id, "queue_id": app.queue_id}
    db = Database(bdb.dsn, size=FLOOR_LOOPS + 2)
    try:
        await claim.seed_tasks(db, owner, tasks)
        store = DispatchStore(db, reservation_lease_s=30, run_lease_s=60, batch_size=FLOOR_BATCH)
        run = await claim.drain(store, owner, tasks=tasks, workers=FLOOR_LOOPS, batch=FLOOR_BATCH)
    finally:
        await db.aclose()
    return {
        "tasks": run.tasks,
        "seconds": round(run.seconds, 3),
        "tasks_per_s": run.tasks_per_s,
        "transactions_per_s": run.transactions_per_s,
        "replays": run.replays,
        "batch": FLOOR_BATCH,
        "loops": FLOOR_LOOPS,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    connections = [int(c) for c in args.connections.split(",")]
    async with bench_database() as bdb:
        commits = await raw_commit_rates(bdb, connections, args.commit_seconds)
        floor = await measure_floor(bdb, args.floor_tasks)
    rows = [
        [f"raw commit rate, {n} connection{'s' if n > 1 else ''}", rate, "commits/s", rate / commits[connections[0]]]
        for n, rate in commits.items()
    ]
    rows.append(
        [
            "SQL floor: claim->start->finish, batch 16, 4 loops",
            floor["tasks_per_s"],
            "tasks/s",
            floor["tasks_per_s"] / commits[connections[0]],
        ]
    )
    rows.append(
        [
            "SQL floor transactions",
            floor["transactions_per_s"],
            "txn/s",
            floor["transactions_per_s"] / commits[connections[0]],
        ]
    )
    table = format_table(["figure", "value", "unit", f"x raw commits @{connections[0]}"], rows, align="lrlr")
    return {
        "scenario": "s0",
        "server": bdb.server_version,
        "figures": {"raw_commits_per_s": commits, "floor": floor},
        "tables": [table],
        "targets": [],
        "notes": [
            f"4 floor loops of batch {FLOOR_BATCH} commit {floor['tasks_per_s'] / commits.get(4, float('nan')):.2f} "
            "tasks per raw commit of 4 connections: a dispatch transaction is 6-9 statements, "
            "and 16 tasks share each."
        ],
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    figures = report["figures"]
    labels = [f"commit x{n}" for n in figures["raw_commits_per_s"]] + ["SQL floor (tasks)"]
    values = list(figures["raw_commits_per_s"].values()) + [figures["floor"]["tasks_per_s"]]
    return [
        plots.bar(
            outdir / "s0-calibration.png",
            labels,
            values,
            title="S0: raw commits/s vs SQL floor tasks/s",
            ylabel="per second",
        )
    ]
