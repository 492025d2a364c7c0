"""Bulk submit: tasks/s through OrbitClient.submit_many, beside single submits.

A real node process. ``--bulk-tasks`` tasks go through ``submit_many`` (``POST
/v1/tasks/batch``, ``--bulk-batch`` tasks per request, ``--bulk-clients`` clients back to
back); tasks/s = tasks / (first request -> last answer), every task committed (checked
by counting the rows). In the same run, ``--bulk-single-tasks`` tasks go through
``submit_task`` (16 clients) for the ratio. Node CPU per task in microseconds, R and H.
Target (issue 27): bulk >= 20x single submits. At each durability setting by default.
"""

from __future__ import annotations

import argparse
import secrets
import time
from typing import Any

import trio

from orbit_sdk import OrbitClient

from . import durability
from .accounting import Measured, measured_phase
from .clients import submit_closed_loop, submit_request
from .database import bench_database, count_tasks, make_app
from .grids import grid
from .processes import node_process
from .report import Target, ms, ratio, summarize
from .units import Units, cost

# bench/__main__.py: one column per durability setting, both by default.
DURABILITY_COLUMNS = True
DURABILITY_DEFAULT = "both"
# Issue 27: bulk submit tasks/s over single submits' (16 clients) of the same run.
TARGET_X_SINGLE = 20.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bulk-tasks", type=int, default=50_000, help="bulk: tasks through submit_many (50000)")
    parser.add_argument("--bulk-batch", type=int, default=1_000, help="bulk: tasks per request, 1-1000 (1000)")
    parser.add_argument("--bulk-clients", type=int, default=2, help="bulk: clients sending batches at once (2)")
    parser.add_argument(
        "--bulk-single-tasks", type=int, default=2_000, help="bulk: tasks through submit_task, for the ratio (2000)"
    )


async def submit_bulk(
    url: str, token: str, queue_id: str, tasks: int, *, batch: int, clients: int, return_tasks: bool = True
) -> list[float]:
    """``tasks`` tasks in batches of ``batch`` by ``clients`` clients; per-batch seconds."""
    latencies: list[float] = []
    starts = iter(range(0, tasks, batch))
    run = secrets.token_hex(4)

    async def client_loop() -> None:
        async with OrbitClient(url, token) as client:
            for start in starts:
                pairs = [(f"bulk-{run}-{i}", submit_request(queue_id)) for i in range(start, min(start + batch, tasks))]
                began = time.perf_counter()
                results = await client.submit_many(pairs, batch_size=batch, return_tasks=return_tasks)
                latencies.append(time.perf_counter() - began)
                refused = [r.error for r in results if r.error is not None]
                if refused:
                    raise RuntimeError(f"bulk submit refused {len(refused)} tasks: {refused[0]}")

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client_loop)
    return latencies


def submitted(tasks: int, seconds: float, phase: Measured) -> dict[str, Any]:
    """The figures of a submit phase: tasks/s and the node's CPU per task."""
    return {
        "tasks": tasks,
        "seconds": seconds,
        "tasks_per_s": tasks / seconds,
        "node_cpu_us_per_task": ratio(phase.cpu["node_cpu_s"] * 1e6, tasks),
        "cpu": phase.cpu,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    units: Units = args.units
    async with bench_database() as bdb, node_process(bdb.dsn) as node:
        single_app = await make_app(bdb.db, "bulk-single")
        async with measured_phase(node.pid, profile=False) as phase:
            started = time.perf_counter()
            single_lat = await submit_closed_loop(
                node.url, single_app.token, single_app.queue_id, args.bulk_single_tasks
            )
            seconds = time.perf_counter() - started
        single = submitted(args.bulk_single_tasks, seconds, phase)
        single["latency_s"] = summarize(single_lat)

        # Each mode on an application (and a queue) of its own: the whole answer, then ids
        # and states only (Prefer: return=minimal).
        modes = {}
        for name, return_tasks in (("tasks", True), ("minimal", False)):
            app = await make_app(bdb.db, f"bulk-{name}")
            async with measured_phase(node.pid, profile=not args.no_profile and not return_tasks) as phase:
                started = time.perf_counter()
                bulk_lat = await submit_bulk(
                    node.url,
                    app.token,
                    app.queue_id,
                    args.bulk_tasks,
                    batch=args.bulk_batch,
                    clients=args.bulk_clients,
                    return_tasks=return_tasks,
                )
                seconds = time.perf_counter() - started
            stored = await count_tasks(bdb.db, "application_id = %s", (app.application_id,))
            modes[name] = {
                **submitted(args.bulk_tasks, seconds, phase),
                "stored": stored,
                "batch": args.bulk_batch,
                "clients": args.bulk_clients,
                "batch_latency_s": summarize(bulk_lat),
                "profile": phase.profile,
            }
    bulk, minimal = modes["tasks"], modes["minimal"]
    labels = {
        "tasks": f"submit_many, batches of {bulk['batch']}, {bulk['clients']} clients",
        "minimal": f"submit_many(return_tasks=False), batches of {minimal['batch']}, {minimal['clients']} clients",
        "single": "submit_task, 16 clients",
    }
    rows = [
        [
            labels[name],
            m["tasks"],
            m["seconds"],
            m["tasks_per_s"],
            ratio(m["tasks_per_s"], single["tasks_per_s"]),
            ms(m["batch_latency_s" if name != "single" else "latency_s"]["p50"]),
            ms(m["batch_latency_s" if name != "single" else "latency_s"]["p99"]),
            m["node_cpu_us_per_task"],
            units.r(m["node_cpu_us_per_task"]),
            units.h(m["node_cpu_us_per_task"]),
            m["cpu"].get("machine_utilisation", "-"),
        ]
        for name, m in (("tasks", bulk), ("minimal", minimal), ("single", single))
    ]
    table = grid(
        ["mode"],
        [
            "tasks",
            "seconds",
            "tasks/s",
            "x single",
            "request p50 ms",
            "request p99 ms",
            "node us/task",
            "R/task",
            "H/task",
            "cpu busy",
        ],
        rows,
        durability.current().name,
    )
    targets = [
        Target.at_least(
            f"bulk submit / single submits (batches of {m['batch']}{', ids only' if name == 'minimal' else ''})",
            ratio(m["tasks_per_s"], single["tasks_per_s"]),
            TARGET_X_SINGLE,
            unit="x",
            note=f"{m['tasks_per_s']:,.0f} vs {single['tasks_per_s']:,.0f} tasks/s; node "
            f"{cost(m['node_cpu_us_per_task'], units, in_h=True)} per task",
        )
        for name, m in modes.items()
    ]
    notes = [
        "tasks/s = tasks / (first request -> last answer); the node, the clients and MariaDB share the machine.",
        "node us/task: the node process's CPU over the phase / tasks; R/task and H/task: the same in R and H.",
    ]
    for name, m in modes.items():
        if m["stored"] != m["tasks"]:
            notes.append(f"WARNING: {name}: {m['stored']} of {m['tasks']} tasks stored")
    return {
        "scenario": "bulk",
        "server": bdb.server_version,
        "figures": {
            "bulk": {k: v for k, v in bulk.items() if k != "profile"},
            "minimal": {k: v for k, v in minimal.items() if k != "profile"},
            "single": single,
        },
        "grids": [table],
        "targets": targets,
        "notes": notes,
        "profiles": {"the node, bulk submit (ids only)": minimal["profile"]} if minimal["profile"] else {},
    }


def plot(report: dict[str, Any], outdir, plots) -> list:
    figures = report["figures"]
    return [
        plots.bar(
            outdir / "bulk-throughput.png",
            [f"submit_many ({figures['bulk']['batch']})", "submit_many, ids only", "submit_task"],
            [figures["bulk"]["tasks_per_s"], figures["minimal"]["tasks_per_s"], figures["single"]["tasks_per_s"]],
            title="Bulk submit: tasks/s",
            ylabel="tasks/s",
        )
    ]
