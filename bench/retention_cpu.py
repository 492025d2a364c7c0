"""Retention's cost to the database server: ``mariadbd`` CPU per durable task, before
retention and after, paired.

A *version* is a source tree: *after* (this one, or ``--retention-after DIR``), and with
``--retention-before DIR`` another commit's (*before*; ``git archive 15723f5 | tar -x -C
DIR``: no migration 000021, no pruner). Trees exported from two commits that differ by
retention alone measure retention alone. Each run of a version uses only that tree's own
commands, so the same harness drives either: a new database on the scenario's server
migrated by the tree's ``orbit-migrate up``, an application from its ``orbit-admin
bootstrap``, and its ``orbit`` node at its defaults. Then the burn-down:
``--retention-cpu-tasks`` no-op tasks submitted in bulk over HTTP (2 clients, 1,000 a
request), drained by 8 SDK Worker connections of capacity 16 (S1's judged shape). Per
phase, the server process's user + system CPU (``/proc/<pid>/stat`` of the private
``mariadbd``) over the tasks: *submit* (the bulk submits) and *drain* (first Worker
start to the last Finish, plus ``TAIL_S`` for the work InnoDB does just after its
commits). The versions take turns, ABAB..., after one warm-up run of *after* that is not
counted; medians per version, and after / before.

Where the tree has a pruner, its run ends with the cost of deleting the same tasks: the
node stopped, the application's retention set to 1 s, a node started with
``ORBIT_PRUNE_INTERVAL_S=1``, the server's CPU until no task is left, per task.
"""

from __future__ import annotations

import argparse
import math
import secrets
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from orbit_node.db import Database
from orbit_node.domain.dsn import Dsn

from .accounting import cpu_seconds
from .bulk import submit_bulk
from .clients import wait_until, worker_fleet
from .database import admin_sql, bench_dsn, count_statements, count_tasks
from .footprint import ServerMeter
from .orbitcmd import Credentials, bootstrap, known_settings, migrate, orbit_process
from .report import Target, format_table, ratio, statement_costs

# The burn-down's shape: S1's judged one (8 connections x capacity 16, no-op handler).
CONNECTIONS = 8
CAPACITY = 16
BULK_BATCH = 1000
BULK_CLIENTS = 2
# After the last Finish: InnoDB's work right after its commits (purge of the undo logs the
# transitions left) is counted in the drain this long.
TAIL_S = 3.0
# The warm-up run's share of the measured runs' tasks.
WARMUP_SHARE = 0.25
# Issue 37: whatever retention adds to the server's CPU per task stays under 5 %.
TARGET_RATIO = 1.05
PRUNE_TIMEOUT_S = 600.0


@asynccontextmanager
async def tree_database(tree: Path | None) -> AsyncIterator[tuple[Dsn, Database]]:
    """A new database migrated by ``tree``'s ``orbit-migrate``; dropped on exit."""
    server = bench_dsn()
    name = "orbit_bench_" + secrets.token_hex(4)
    await admin_sql(server, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    dsn = server.with_database(name)
    db = Database(dsn, size=2)
    try:
        await migrate(dsn, tree=tree)
        yield dsn, db
    finally:
        with trio.CancelScope(shield=True):
            await db.aclose()
            with trio.move_on_after(120):
                await admin_sql(server, f"DROP DATABASE IF EXISTS `{name}`")


async def burn_down(tree: Path | None, tasks: int, *, prune: bool) -> dict[str, Any]:
    """One run of one version: submit, drain and (``prune``) delete ``tasks`` tasks; CPU per phase."""
    async with tree_database(tree) as (dsn, db):
        creds: Credentials = await bootstrap(dsn, "cpu", tree=tree)
        meter = await ServerMeter.of(db)
        if meter.pid is None:
            raise RuntimeError("the server's process cannot be read (its pid file): run on the bench's private server")
        async with orbit_process(dsn, tree=tree) as node:
            await meter.start()
            node_cpu = cpu_seconds(node.pid)
            began = time.perf_counter()
            async with count_statements(db) as submit_statements:
                await submit_bulk(node.url, creds.token, creds.queue_id, tasks, batch=BULK_BATCH, clients=BULK_CLIENTS)
            submit = {
                "seconds": time.perf_counter() - began,
                **await meter.stop(),
                "node_cpu_s": cpu_seconds(node.pid) - node_cpu,
                "per_task": statement_costs(submit_statements.delta, tasks),
            }
            await meter.start()
            node_cpu = cpu_seconds(node.pid)
            async with count_statements(db) as drain_statements:
                began = time.perf_counter()
                async with worker_fleet(
                    node.url, [(creds.token, [creds.queue_id])] * CONNECTIONS, capacity=CAPACITY
                ) as fleet:
                    complete = await wait_until(lambda: fleet.completed >= tasks, timeout_s=max(120.0, tasks / 20))
                    seconds = time.perf_counter() - began
                    done = fleet.completed
                await trio.sleep(TAIL_S)
            drain = {
                "seconds": seconds,
                "tasks_per_s": done / seconds,
                "complete": complete,
                **await meter.stop(),
                "node_cpu_s": cpu_seconds(node.pid) - node_cpu,
                "per_task": statement_costs(drain_statements.delta, done),
            }
        pruned: dict[str, Any] = {}
        if prune:
            pruned = await prune_all(dsn, db, meter, tree, tasks)
    out: dict[str, Any] = {"tasks": done, "submit": submit, "drain": drain, "prune": pruned}
    for phase in ("submit", "drain"):
        out[phase]["server_us_per_task"] = ratio(out[phase]["server_cpu_s"] * 1e6, done)
        out[phase]["node_us_per_task"] = ratio(out[phase]["node_cpu_s"] * 1e6, done)
    out["server_us_per_task"] = out["submit"]["server_us_per_task"] + out["drain"]["server_us_per_task"]
    return out


async def prune_all(dsn: Dsn, db: Database, meter: ServerMeter, tree: Path | None, tasks: int) -> dict[str, Any]:
    """The finished tasks deleted by a node's pruner (retention 1 s, a round every second)."""
    await db.run(lambda tx: tx.execute_raw("UPDATE applications SET retain_succeeded_s = 1, retain_failed_s = 1"))
    await trio.sleep(1.5)
    await meter.start()
    began = time.perf_counter()
    left = -1
    async with orbit_process(dsn, tree=tree, settings={"ORBIT_PRUNE_INTERVAL_S": "1"}) as node:
        node_cpu = cpu_seconds(node.pid)
        with trio.move_on_after(PRUNE_TIMEOUT_S):
            while (left := await count_tasks(db)) > 0:
                await trio.sleep(0.25)
        node_used = cpu_seconds(node.pid) - node_cpu
    seconds = time.perf_counter() - began
    used = await meter.stop()
    return {
        "seconds": seconds,
        "left": left,
        **used,
        "node_cpu_s": node_used,
        "server_us_per_task": ratio(used["server_cpu_s"] * 1e6, tasks),
        "binlog_per_task": ratio(used["binlog_bytes"], tasks) if used["binlog_bytes"] is not None else math.nan,
    }


def has_pruner(tree: Path | None) -> bool:
    return "ORBIT_PRUNE_INTERVAL_S" in known_settings(tree)


async def run_part(args: argparse.Namespace) -> dict[str, Any]:
    tasks = args.retention_cpu_tasks
    before: Path | None = args.retention_before
    after: Path | None = args.retention_after.resolve() if args.retention_after is not None else None
    versions: list[tuple[str, Path | None]] = [("after", after)]
    if before is not None:
        versions.insert(0, ("before", before.resolve()))
    prunes = {label: has_pruner(tree) for label, tree in versions}
    runs: list[dict[str, Any]] = []
    warmup = await burn_down(after, max(1000, int(tasks * WARMUP_SHARE)), prune=False)
    for round_ in range(args.retention_cpu_rounds):
        for label, tree in versions:
            run = await burn_down(tree, tasks, prune=prunes[label])
            runs.append({"version": label, "round": round_ + 1, **run})
    medians = {
        label: {
            key: statistics.median(pick(r) for r in runs if r["version"] == label)
            for key, pick in (
                ("submit", lambda r: r["submit"]["server_us_per_task"]),
                ("drain", lambda r: r["drain"]["server_us_per_task"]),
                ("total", lambda r: r["server_us_per_task"]),
                ("node_drain", lambda r: r["drain"]["node_us_per_task"]),
                ("prune", lambda r: r["prune"].get("server_us_per_task", math.nan)),
            )
        }
        for label, _ in versions
    }
    rows = [
        [
            r["version"],
            r["round"],
            r["tasks"],
            r["submit"]["server_us_per_task"],
            r["drain"]["server_us_per_task"],
            r["server_us_per_task"],
            r["drain"]["tasks_per_s"],
            r["drain"]["node_us_per_task"],
            r["drain"]["per_task"]["statements"],
            r["prune"].get("server_us_per_task", math.nan),
            r["prune"].get("seconds", math.nan),
        ]
        for r in runs
    ]
    for label, m in medians.items():
        rows.append(
            [f"median {label}", "", "", m["submit"], m["drain"], m["total"], "", m["node_drain"], "", m["prune"], ""]
        )
    table = format_table(
        [
            "version",
            "round",
            "tasks",
            "mariadbd us/task submit",
            "drain",
            "submit+drain",
            "drain tasks/s",
            "node us/task drain",
            "statements/task drain",
            "mariadbd us/task prune",
            "prune s",
        ],
        rows,
        align="lr" + "r" * 9,
    )
    targets = []
    ratios: dict[str, float] = {}
    if "before" in medians:
        ratios = {k: ratio(medians["after"][k], medians["before"][k]) for k in ("submit", "drain", "total")}
        targets.append(
            Target.at_most(
                "mariadbd CPU per task, after / before retention (submit + drain)",
                ratios["total"],
                TARGET_RATIO,
                note=f"medians of {args.retention_cpu_rounds} paired runs of {tasks} tasks; submit "
                f"{ratios['submit']:.3f}, drain {ratios['drain']:.3f}",
            )
        )
    return {
        "warmup": warmup,
        "runs": runs,
        "medians": medians,
        "ratios": ratios,
        "tables": [table],
        "targets": targets,
        "notes": [
            f"cpu: mariadbd user+system CPU from /proc/<pid>/stat of the scenario's private server over each phase, "
            f"per task; drain = first Worker start to last Finish + {TAIL_S:g} s; {CONNECTIONS} Worker connections x "
            f"capacity {CAPACITY}, no-op handler; bulk submits {BULK_CLIENTS} clients x {BULK_BATCH}; one warm-up run "
            f"of 'after' first (not counted); each run on a new database migrated by its own tree"
            + f"; after = {after or 'this tree'}"
            + (f"; before = {before}" if before is not None else "; no --retention-before: 'after' alone"),
            "prune: the node stopped, the application's retention set to 1 s, a node with ORBIT_PRUNE_INTERVAL_S=1 "
            "until no task is left; mariadbd CPU over that time per task (the idle node's own statements included)",
        ],
    }
