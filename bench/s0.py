"""S0 calibration: the database's raw commit rate and Orbit's raw SQL floor.

* raw commit rate: single-row autocommit INSERTs on 1, 4 and 16 connections (one round
  trip and one commit each): what the server can commit at all.
* SQL floor: the dispatch core's own claim -> start -> finish transactions
  (``LeaseStore``, batch 16, 4 loops = the node's 4 claim SQL slots) in a bare loop,
  no HTTP, no WebSocket, no scheduler: the most Orbit's SQL can do on this server.

Other scenarios call ``measure_floor`` so their ratios come from the same run.
"""

from __future__ import annotations

import argparse
from typing import Any

from orbit_node.db import Database
from orbit_node.store.leases import LeaseStore

from . import claim, durability
from .database import App, BenchDb, bench_database, count_statements, make_app
from .grids import grid
from .report import STATEMENTS_NOTE, Target, ratio, statement_costs, statements_table

# The node's claim batch and claim SQL slots: the floor runs Orbit's SQL the way a node would.
FLOOR_BATCH = 16
FLOOR_LOOPS = 4
# bench/__main__.py: one column per durability setting, both by default (the commit rate is
# what the durability setting changes first).
DURABILITY_COLUMNS = True
DURABILITY_DEFAULT = "both"
# Issue 13 target: floor tasks/s over the raw commit rate of as many connections as floor loops.
TARGET_TASKS_PER_RAW_COMMIT = 0.6


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
        store = LeaseStore(db, reservation_lease_s=30, run_lease_s=60, batch_size=FLOOR_BATCH)
        async with count_statements(db) as statements:
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
        "claims": run.claims,
        "statements": statements.delta,
        "per_task": statement_costs(statements.delta, run.tasks),
        "per_claim": statement_costs(statements.delta, run.claims),
    }


def floor_statement_rows(floor: dict[str, Any]) -> list[tuple[str, str, dict[str, float]]]:
    """The floor's rows of a ``statements_table``."""
    return [("SQL floor drain", "task", floor["per_task"]), ("SQL floor drain", "claim", floor["per_claim"])]


def floor_target(floor: dict[str, Any], raw_commits_per_s: float) -> Target:
    return Target.at_least(
        f"S0 SQL floor tasks per raw commit, batch {FLOOR_BATCH}",
        ratio(floor["tasks_per_s"], raw_commits_per_s),
        TARGET_TASKS_PER_RAW_COMMIT,
        note=f"floor tasks/s over the raw commit rate of {FLOOR_LOOPS} connections ({FLOOR_LOOPS} floor loops)",
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    connections = [int(c) for c in args.connections.split(",")]
    if FLOOR_LOOPS not in connections:
        connections.append(FLOOR_LOOPS)
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
    table = grid(
        ["figure", "unit"],
        ["value", f"x raw commits @{connections[0]}"],
        [[figure, unit, value, times] for figure, value, unit, times in rows],
        durability.current().name,
    )
    per_task = floor["per_task"]
    return {
        "scenario": "s0",
        "server": bdb.server_version,
        "figures": {"raw_commits_per_s": commits, "floor": floor},
        "grids": [table],
        "tables": [statements_table(floor_statement_rows(floor))],
        "targets": [floor_target(floor, commits[FLOOR_LOOPS])],
        "notes": [
            f"{FLOOR_LOOPS} floor loops of batch {FLOOR_BATCH}: {ratio(floor['tasks_per_s'], commits[FLOOR_LOOPS]):.2f} "
            f"tasks per raw commit of {FLOOR_LOOPS} connections; {per_task['statements']:.2f} statements and "
            f"{per_task['commits']:.3f} COMMITs per task ({ratio(1.0, per_task['commits']):.1f} tasks per COMMIT).",
            STATEMENTS_NOTE,
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
